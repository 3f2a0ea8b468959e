"""The ``funnel_*`` settings, read once from ``app.conf`` and checked.

Each name is accepted as ``funnel_x``, ``FUNNEL_X`` and ``CELERY_FUNNEL_X`` (Django
projects load settings with ``namespace="CELERY"``, and Celery does not map unknown
keys for them).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._errors import ConfigurationError
from ._limit import Limit, parse_limit
from ._outage import POLICIES

__all__ = ["FunnelSettings", "read_setting"]

_DEFAULTS: dict[str, Any] = {
    "funnel_redis_url": None,
    "funnel_redis_options": None,  # read and checked by _runtime.Runtime.redis_options
    "funnel_limits": {},
    "funnel_key_prefix": "funnel:",
    "funnel_max_countdown": None,
    "funnel_reservation": True,
    "funnel_max_deferrals": 1000,
    "funnel_throttle_eager": False,
    "funnel_socket_timeout": 1.0,
    "funnel_on_backend_error": "defer",
    "funnel_dry_run": False,
}


def read_setting(conf: Mapping[str, Any], name: str) -> Any:
    """``conf``'s value for ``name`` in any of its spellings, else the default."""
    for spelling in (name, name.upper(), f"CELERY_{name.upper()}"):
        if spelling in conf and conf[spelling] is not None:
            return conf[spelling]
    return _DEFAULTS[name]


def _unknown(conf: Mapping[str, Any]) -> list[str]:
    known = set(_DEFAULTS)
    found = []
    for key in conf:
        name = key.lower().removeprefix("celery_")
        if name.startswith("funnel_") and name not in known:
            found.append(key)
    return found


def check_policy(name: str, value: Any) -> str:
    """A ``funnel_on_backend_error`` value, checked."""
    if value not in POLICIES:
        raise ConfigurationError(f"{name} must be one of {list(POLICIES)}, got {value!r}")
    return str(value)


def _positive(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
    if value <= 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _limits(value: Any) -> tuple[Limit, ...]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"funnel_limits must be a dict of task-name pattern -> rate, got {value!r}"
        )
    return tuple(
        parse_limit(spec, pattern=pattern, where=f"funnel_limits[{pattern!r}]")
        for pattern, spec in value.items()
    )


def _max_deferrals(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigurationError(
            f"funnel_max_deferrals must be a positive integer or None, got {value!r}"
        )
    return value if value is None else int(value)


@dataclass(frozen=True)
class FunnelSettings:
    """The package's settings for one Celery app, validated.

    Raises:
        ConfigurationError: naming the setting and its value.
    """

    redis_url: Any
    limits: tuple[Limit, ...] = ()
    key_prefix: str = "funnel:"
    max_countdown: float | None = None
    reservation: bool = True
    max_deferrals: int | None = 1000
    throttle_eager: bool = False
    socket_timeout: float = 1.0
    on_backend_error: str = "defer"
    dry_run: bool = False
    unknown: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> FunnelSettings:
        """Read and check every ``funnel_*`` setting of ``conf``; warn about unknown ones."""

        def get(name: str) -> Any:
            return read_setting(conf, name)

        limits = _limits(get("funnel_limits"))
        prefix = get("funnel_key_prefix")
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise ConfigurationError(
                f"funnel_key_prefix must be a string without braces, got {prefix!r}"
            )
        deferrals = _max_deferrals(get("funnel_max_deferrals"))
        settings = cls(
            redis_url=get("funnel_redis_url"),
            limits=limits,
            key_prefix=prefix,
            max_countdown=_positive(
                "funnel_max_countdown", get("funnel_max_countdown"), allow_none=True
            ),
            reservation=bool(get("funnel_reservation")),
            max_deferrals=deferrals,
            throttle_eager=bool(get("funnel_throttle_eager")),
            socket_timeout=_positive("funnel_socket_timeout", get("funnel_socket_timeout")) or 1.0,
            on_backend_error=check_policy(
                "funnel_on_backend_error", get("funnel_on_backend_error")
            ),
            dry_run=bool(get("funnel_dry_run")),
            unknown=tuple(_unknown(conf)),
        )
        for name in settings.unknown:
            warnings.warn(f"unknown celery-funnel setting {name!r} ignored", stacklevel=2)
        return settings

    def require_redis(self) -> Any:
        """``funnel_redis_url``, which throttling needs (never the broker's, silently)."""
        if not self.redis_url:
            raise ConfigurationError(
                "funnel_redis_url is not set: set app.conf.funnel_redis_url to the Redis"
                " that keeps the funnels (it may be the broker's, but must be said)"
            )
        if not isinstance(self.redis_url, str) and not hasattr(self.redis_url, "execute_command"):
            raise ConfigurationError(
                f"funnel_redis_url must be a redis:// URL or a redis-py client,"
                f" got {self.redis_url!r}"
            )
        return self.redis_url
