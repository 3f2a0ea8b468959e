"""The funnels' Redis password, masked where Celery shows a worker's configuration:
``celery inspect conf`` and what reads it (Flower's Config tab, ``/api/workers``).

Celery masks settings whose names look secret (``...PASS...``, ``...TOKEN...``, so
``funnel_redis_options`` passwords and a dashboard token already) and its own broker
and backend URLs under their lowercase names, but not ``funnel_redis_url``, nor the
broker's and backend's URLs under a namespace (``CELERY_BROKER_URL`` from Django's
settings). The worker's ``conf`` remote-control command is wrapped once per process;
the wrapper masks those URLs for apps that installed celery-funnel, and answers as
Celery does otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .._config.runtime import runtime_for
from .._config.settings import setting_name
from .._limiter.backends._clients import mask_url

__all__ = ["mask_conf", "masked"]

URL_SETTINGS = ("funnel_redis_url",)
# Celery's own URLs, as a namespaced configuration names them
CELERY_URLS = ("broker_url", "broker_read_url", "broker_write_url", "result_backend")
_STARRED = re.compile(r"://[^:@/]*:\*+@")  # a password masked already


def masked(app: Any, table: Any) -> Any:
    """``table`` (a worker's configuration, name -> value) with the password of every
    ``funnel_*`` URL setting masked, when ``app`` installed celery-funnel."""
    if not isinstance(table, dict) or not runtime_for(app).installed:
        return table
    return {key: _mask(value) if _url(key) and value else value for key, value in table.items()}


def _mask(value: Any) -> Any:
    """``value`` masked, unless Celery masked it already (its stars kept)."""
    return value if isinstance(value, str) and _STARRED.search(value) else mask_url(value)


def _url(key: Any) -> bool:
    """Whether setting ``key`` holds a URL that may carry a password."""
    if not isinstance(key, str):
        return False
    return setting_name(key) in URL_SETTINGS or key.lower().removeprefix("celery_") in CELERY_URLS


def mask_conf() -> None:
    """Wrap the worker's ``conf`` remote-control command (once per process)."""
    from celery.worker.control import Panel  # noqa: PLC0415 - the worker's, when installing

    original: Callable[..., Any] = Panel.data["conf"]
    if getattr(original, "celery_funnel_masks", False):
        return

    def conf(state: Any, *args: Any, **kwargs: Any) -> Any:
        return masked(state.app, original(state, *args, **kwargs))

    conf.celery_funnel_masks = True  # type: ignore[attr-defined]
    conf.__doc__ = original.__doc__
    Panel.data["conf"] = conf
