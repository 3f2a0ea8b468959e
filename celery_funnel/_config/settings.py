"""The ``funnel_*`` settings, read once from ``app.conf`` and checked.

Each name is accepted as ``funnel_x``, ``FUNNEL_X`` and ``CELERY_FUNNEL_X`` (Django
projects load settings with ``namespace="CELERY"``, and Celery does not map unknown
keys for them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._limiter.concurrency import ConcurrencyLimit, split_entry
from .._limiter.errors import ConfigurationError
from .._limiter.limit import Limit, parse_limit, unique_names
from .._limiter.values import (
    MAX_COUNTDOWN,
    MAX_TIMEOUT,
    MIN_COUNTDOWN,
    MIN_TIMEOUT,
    closest,
    did_you_mean,
    number,
    to_bool,
)
from .options import OPTIONS
from .outage import check_policy

__all__ = ["FunnelSettings", "check_names", "read_setting", "setting_name"]

_DEFAULTS: dict[str, Any] = {
    "funnel_redis_url": None,
    "funnel_redis_options": None,  # read and checked by _config.runtime.Runtime.redis_options
    "funnel_limits": {},
    "funnel_key_prefix": "funnel:",
    "funnel_max_countdown": None,
    "funnel_reservation": True,
    "funnel_allowance": True,
    "funnel_max_deferrals": 1000,
    "funnel_throttle_eager": False,
    "funnel_socket_timeout": 1.0,
    "funnel_on_backend_error": "defer",
    "funnel_dry_run": False,
    "funnel_park": "auto",
    "funnel_park_after": 5.0,
    "funnel_park_lease": 30.0,
    "funnel_lease_ttl": 30.0,
    "funnel_log_waits_over": 5.0,
    "funnel_log_summary_every": 60.0,
}


def read_setting(conf: Mapping[str, Any], name: str) -> Any:
    """``conf``'s value for ``name`` in any of its spellings, else the default."""
    for spelling in (name, name.upper(), f"CELERY_{name.upper()}"):
        if spelling in conf and conf[spelling] is not None:
            return conf[spelling]
    return _DEFAULTS[name]


def setting_name(key: object) -> str | None:
    """The ``funnel_*`` name a conf key spells (``CELERY_FUNNEL_X`` -> ``funnel_x``), or
    None when it is no key of this package. An upper-case ``FUNNEL_*`` key that is no
    setting and resembles none may belong to another library (a Django project's conf
    holds every Django setting): it is left alone."""
    text = str(key)
    name = text.lower().removeprefix("celery_")
    if not name.startswith("funnel_"):
        return None
    if text.isupper() and not text.startswith("CELERY_") and name not in _DEFAULTS:
        return name if did_you_mean(name, [*_DEFAULTS, *OPTIONS]) else None
    return name


def check_names(conf: Mapping[str, Any]) -> None:
    """Refuse a ``funnel_*`` key of ``conf`` that is no setting (a misspelling would
    otherwise be ignored), suggesting the setting meant.

    Raises:
        ConfigurationError: naming the key and its value.
    """
    for key in list(conf):
        name = setting_name(key)
        if name is None or name in _DEFAULTS:
            continue
        close = closest(name, [*_DEFAULTS, *OPTIONS])
        hint = "" if close is None else f" (did you mean {_spelled(key, close)!r}?)"
        if close in OPTIONS or name in OPTIONS:
            hint += (
                " - funnel_rate and the other task options go on a FunnelTask"
                " (@app.task(base=FunnelTask, funnel_rate=...)) or in task_annotations;"
                " worker-wide limits go in funnel_limits"
            )
        raise ConfigurationError(
            f"app.conf.{key}={conf[key]!r} is not a celery-funnel setting{hint};"
            f" the settings are {sorted(_spelled(key, n) for n in _DEFAULTS)}"
        )


def _spelled(key: object, name: str) -> str:
    """Setting ``name`` spelled as ``key`` is (``CELERY_FUNNEL_X``, ``FUNNEL_X`` or
    ``funnel_x``): a Django project's conf is answered in its own spelling."""
    text = str(key)
    if not text.isupper():
        return name
    return f"CELERY_{name.upper()}" if text.startswith("CELERY_") else name.upper()


def _pattern(pattern: object) -> str:
    """A ``funnel_limits`` key, checked: a non-empty string, a task name or a glob.

    Raises:
        ConfigurationError: naming ``funnel_limits`` and the pattern (one line).
    """
    # Anything else used to pass: bytes or a number started the worker and then failed
    # every task in the gate (fnmatch cannot match a str against them); None read as
    # a task's own limit and so matched nothing; "" matches no task name.
    if isinstance(pattern, str) and pattern:
        return pattern
    what = "is empty" if isinstance(pattern, str) else f"is not a string ({type(pattern).__name__})"
    raise ConfigurationError(
        f"funnel_limits: pattern {pattern!r} {what}; patterns are non-empty strings,"
        f" task names or globs like 'emails.*'"
    )


def _limits(value: Any) -> tuple[tuple[Limit, ...], tuple[ConcurrencyLimit, ...]]:
    """The rate limits and the concurrency limits of ``funnel_limits``."""
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"funnel_limits must be a dict of task-name pattern -> rate, got {value!r}"
        )
    limits: list[Limit] = []
    concurrency: list[ConcurrencyLimit] = []
    for key, spec in value.items():
        pattern = _pattern(key)
        rest, seats = split_entry(pattern, spec)
        if seats is not None:
            concurrency.append(seats)
        if rest is not None:
            limits.append(parse_limit(rest, pattern=pattern, where=f"funnel_limits[{pattern!r}]"))
    unique_names(limits, "funnel_limits", lambda i: f"[{limits[i].pattern!r}]['name']")
    return tuple(limits), tuple(concurrency)


def _park_mode(value: Any) -> bool | str:
    """``funnel_park``: "auto", or a boolean."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return to_bool("funnel_park", value)
    except ConfigurationError:
        raise ConfigurationError(
            f"funnel_park must be 'auto' (park where the funnels' Redis has AOF on or is the"
            f" broker's own Redis server), True"
            f" or False, got {value!r}"
        ) from None


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
    # a worker takes k units of a fast funnel at once and spends them itself while the
    # funnel is far from full (_gate.allowance; only where reservation is on)
    allowance: bool = False
    max_deferrals: int | None = 1000
    throttle_eager: bool = False
    socket_timeout: float = 1.0
    on_backend_error: str = "defer"
    dry_run: bool = False
    # park waits longer than park_after in Redis (not the broker): "auto" where that
    # Redis has AOF on or is the broker's own server (_stores.persistence), True
    # insists, False never
    park: bool | str = "auto"
    park_after: float = 5.0  # seconds
    park_lease: float = 30.0  # seconds a releaser's claim lasts
    concurrency: tuple[ConcurrencyLimit, ...] = ()  # funnel_limits entries with "concurrency"
    lease_ttl: float = 30.0  # seconds a concurrency seat lasts unless renewed
    log_waits_over: float = 5.0  # a longer wait is logged at INFO (one line per deferral)
    log_summary_every: float = 60.0  # while tasks wait, a line per funnel this often (0: off)

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> FunnelSettings:
        """Read and check every ``funnel_*`` setting of ``conf``.

        Raises:
            ConfigurationError: for an unknown ``funnel_*`` key (with the setting it
                resembles) or a value out of its bounds, naming the setting and value.
        """
        check_names(conf)

        def get(name: str) -> Any:
            return read_setting(conf, name)

        prefix = get("funnel_key_prefix")
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise ConfigurationError(
                f"funnel_key_prefix must be a string without braces, got {prefix!r}"
            )
        countdown = get("funnel_max_countdown")
        if countdown is not None:
            countdown = number("funnel_max_countdown", countdown, MIN_COUNTDOWN, MAX_COUNTDOWN)
        limits, concurrency = _limits(get("funnel_limits"))
        return cls(
            redis_url=get("funnel_redis_url"),
            limits=limits,
            key_prefix=prefix,
            max_countdown=countdown,
            reservation=to_bool("funnel_reservation", get("funnel_reservation")),
            allowance=to_bool("funnel_allowance", get("funnel_allowance")),
            max_deferrals=_max_deferrals(get("funnel_max_deferrals")),
            throttle_eager=to_bool("funnel_throttle_eager", get("funnel_throttle_eager")),
            socket_timeout=number(
                "funnel_socket_timeout", get("funnel_socket_timeout"), MIN_TIMEOUT, MAX_TIMEOUT
            ),
            on_backend_error=check_policy(
                "funnel_on_backend_error", get("funnel_on_backend_error")
            ),
            dry_run=to_bool("funnel_dry_run", get("funnel_dry_run")),
            park=_park_mode(get("funnel_park")),
            park_after=number("funnel_park_after", get("funnel_park_after"), 0.0, 3600.0),
            park_lease=number("funnel_park_lease", get("funnel_park_lease"), 1.0, 3600.0),
            concurrency=concurrency,
            lease_ttl=number("funnel_lease_ttl", get("funnel_lease_ttl"), 0.5, 3600.0),
            log_waits_over=number(
                "funnel_log_waits_over", get("funnel_log_waits_over"), 0.0, 31_536_000.0
            ),
            log_summary_every=number(
                "funnel_log_summary_every", get("funnel_log_summary_every"), 0.0, 86_400.0
            ),
        )

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
