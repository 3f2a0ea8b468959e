"""The options of unique and debounced tasks, read and checked: ``funnel_unique`` (with
``funnel_unique_ttl``) and ``funnel_debounce`` (with ``funnel_debounce_max``), both
keyed by ``funnel_key``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._limiter.errors import ConfigurationError
from .._limiter.values import number, to_bool

__all__ = [
    "DEFAULT_UNIQUE_TTL",
    "MIN_UNIQUE_TTL",
    "Debounce",
    "Unique",
    "check_dedupe",
]

DEFAULT_UNIQUE_TTL = 600.0  # seconds a unique key outlives its last sign of life
MIN_UNIQUE_TTL = 3.0
_MOST = 30 * 86400.0  # a day count that no duration here should pass

Getter = Callable[[str], Any]


@dataclass(frozen=True)
class Unique:
    """``funnel_unique=True``: one task per key waits or runs; its key is held ``ttl``
    seconds past the send, renewed while it runs."""

    key: Any  # funnel_key: format string or callable
    ttl: float


@dataclass(frozen=True)
class Debounce:
    """``funnel_debounce=seconds``: sends per key collapse into one run, ``seconds``
    after the last send, at most ``most`` seconds after the first (None: no bound)."""

    key: Any
    seconds: float
    most: float | None


def _unique(where: str, get: Getter) -> Unique | None:
    on = get("funnel_unique")
    ttl = get("funnel_unique_ttl")
    if on is None or not to_bool(f"{where}: funnel_unique", on):
        if ttl is not None:
            raise ConfigurationError(
                f"{where}: funnel_unique_ttl={ttl!r} has no effect without funnel_unique=True"
            )
        return None
    seconds = DEFAULT_UNIQUE_TTL if ttl is None else ttl
    # renewed every second at most: a TTL of 3 s leaves a renewal two chances
    seconds = number(f"{where}: funnel_unique_ttl", seconds, MIN_UNIQUE_TTL, _MOST)
    return Unique(_key(where, "funnel_unique=True", get), seconds)


def _debounce(where: str, get: Getter) -> Debounce | None:
    seconds, most = get("funnel_debounce"), get("funnel_debounce_max")
    if seconds is None:
        if most is not None:
            raise ConfigurationError(
                f"{where}: funnel_debounce_max={most!r} has no effect without funnel_debounce"
            )
        return None
    wait = _positive(f"{where}: funnel_debounce", seconds)
    bound = None if most is None else _positive(f"{where}: funnel_debounce_max", most)
    if bound is not None and bound < wait:
        raise ConfigurationError(
            f"{where}: funnel_debounce_max={most!r} is less than funnel_debounce={seconds!r}:"
            f" a run comes at most funnel_debounce_max after the first send"
        )
    return Debounce(_key(where, f"funnel_debounce={seconds!r}", get), wait, bound)


def _positive(where: str, value: Any) -> float:
    seconds = number(where, value, 0.0, _MOST)
    if seconds <= 0:
        raise ConfigurationError(f"{where} must be a positive number of seconds, got {value!r}")
    return seconds


def _key(where: str, option: str, get: Getter) -> Any:
    key = get("funnel_key")
    if key is None:
        raise ConfigurationError(
            f"{where}: {option} needs funnel_key (the arguments that make two sends the"
            f' same, e.g. funnel_key="{{record_id}}")'
        )
    return key


def check_dedupe(where: str, get: Getter) -> tuple[Unique | None, Debounce | None]:
    """The unique and debounce options read by ``get``, checked.

    Raises:
        ConfigurationError: naming ``where``, the option and the value.
    """
    unique, debounce = _unique(where, get), _debounce(where, get)
    if unique is not None and debounce is not None:
        raise ConfigurationError(
            f"{where}: funnel_unique=True and funnel_debounce={get('funnel_debounce')!r} on one"
            f" task: a debounced key already runs once per burst; choose one"
        )
    return unique, debounce
