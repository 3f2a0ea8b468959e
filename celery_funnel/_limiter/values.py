"""Checks for single configuration values: booleans, bounded numbers, names with a
"did you mean", the fields of a ``funnel_key`` format string, and key values.

Every check raises ``ConfigurationError`` whose message starts with ``where`` (the
task or setting) and names the option and the value.
"""

from __future__ import annotations

import datetime
import decimal
import difflib
import enum
import math
import string
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "MAX_CAPACITY",
    "MAX_TIMEOUT",
    "MIN_COUNTDOWN",
    "MIN_TIMEOUT",
    "check_fields",
    "check_plain",
    "did_you_mean",
    "format_fields",
    "number",
    "to_bool",
]

# Bounds on values no one means. Capacity: a burst of more than a million tasks is
# no limit at all. Countdown: publishing again sooner than 50 ms is a loop.
# Timeouts: a Redis call on the consumer's event loop may block it this long at most.
MAX_CAPACITY = 1_000_000
MIN_COUNTDOWN = 0.05
MAX_COUNTDOWN = 86400.0
MIN_TIMEOUT = 0.01
MAX_TIMEOUT = 300.0

# Celery's own spellings (celery.utils.serialization.strtobool), which it applies to
# boolean settings read from the environment and the command line.
_BOOLEANS = {
    "true": True, "yes": True, "on": True, "1": True,
    "false": False, "no": False, "off": False, "0": False,
}  # fmt: skip

# Values whose str() is the same in every process: a funnel key made from them names
# the same funnel on every worker and for every task.
_PLAIN = (
    str, bytes, int, float, decimal.Decimal, uuid.UUID, enum.Enum,
    datetime.date, datetime.time, datetime.timedelta, type(None),
)  # fmt: skip


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to ``name``, else ``""``."""
    close = closest(name, known)
    return f" (did you mean {close!r}?)" if close is not None else ""


def closest(name: str, known: Iterable[str]) -> str | None:
    """The one of ``known`` closest to ``name``, if one is close enough."""
    known = list(known)
    # compare what differs: a shared "funnel_" would make any two names look alike
    cut = name.rfind("_", 0, _shared_prefix([name, *known])) + 1  # whole words only
    close = difflib.get_close_matches(name[cut:], [k[cut:] for k in known], n=1, cutoff=0.6)
    return name[:cut] + close[0] if close else None


def _shared_prefix(words: list[str]) -> int:
    """The length of the prefix every word of ``words`` starts with."""
    first, last = min(words), max(words)  # the two that differ soonest
    size = 0
    while size < len(first) and first[size] == last[size]:
        size += 1
    return size


def to_bool(where: str, value: Any) -> bool:
    """A boolean option: ``True``/``False``, 1/0, or one of Celery's strings (``"true"``,
    ``"false"``, ``"yes"``, ``"no"``, ``"on"``, ``"off"``, ``"1"``, ``"0"``, any case).

    Raises:
        ConfigurationError: for anything else (``bool("false")`` would be True).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _BOOLEANS:
        return _BOOLEANS[value.strip().lower()]
    raise ConfigurationError(
        f"{where} must be a boolean (True/False, or one of {sorted(_BOOLEANS)}), got {value!r}"
    )


def number(where: str, value: Any, low: float, high: float, *, unit: str = "seconds") -> float:
    """A finite number in ``[low, high]``, as a float.

    Raises:
        ConfigurationError: naming ``where``, the bounds and the value.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise ConfigurationError(
            f"{where} must be a number of {unit} from {low:g} to {high:g}, got {value!r}"
        )
    return float(value)


def format_fields(where: str, key: str) -> list[str]:
    """The argument names a ``funnel_key`` format string reads: ``"{customer.id}:{region}"``
    gives ``["customer", "region"]``.

    Raises:
        ConfigurationError: when ``key`` is not a valid format string, or has a
            positional field (``{}``, ``{0}``): fields name the task's parameters.
    """
    formatter = string.Formatter()
    try:
        parsed = list(formatter.parse(key))
    except ValueError as exc:
        raise ConfigurationError(f"{where}={key!r} is not a valid format string: {exc}") from None
    names = []
    for _, field, _, _ in parsed:
        if field is None:
            continue
        first = field.split(".", 1)[0].split("[", 1)[0]
        if not first.isidentifier():
            raise ConfigurationError(
                f"{where}={key!r}: each field must name a parameter of the task"
                f" (like '{{customer_id}}'), got {{{field}}}"
            )
        names.append(first)
    return names


def check_fields(where: str, key: object, params: Sequence[str], owner: str) -> None:
    """Refuse a format-string ``key`` (``where`` names it) whose fields are not among
    ``params``, the parameters of ``owner`` ("the task"): every call would fail with a
    bare ``KeyError``. A key that is not a string passes.

    Raises:
        ConfigurationError: naming the key, the field and the parameters.
    """
    if not isinstance(key, str):
        return
    for field in format_fields(where, key):
        if field not in params:
            raise ConfigurationError(
                f"{where}={key!r} names {field!r}, which is not a parameter of {owner}"
                f"{did_you_mean(field, params)}; its parameters are {list(params)}"
            )


def check_plain(where: str, field: str, value: Any) -> Any:
    """``value`` when its ``str()`` is the same in every process (str, bytes, numbers,
    UUID, Decimal, Enum, dates and times, None, and lists, tuples and dicts of those);
    returned unchanged.

    Raises:
        ConfigurationError: for any other value (an object whose ``str()`` holds its
            address would make one funnel per task), naming the field and the value.
    """
    if _is_plain(value):
        return value
    instead = "return one" if field.endswith(")") else f"e.g. '{{{field}.id}}'"
    raise ConfigurationError(
        f"{where}: {field}={value!r} ({type(value).__name__}) cannot be part of a funnel key:"
        f" its str() may differ between calls and processes. Key on plain data (str, int,"
        f" float, UUID, Decimal, date/time, None): {instead}"
    )


def _is_plain(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if depth < 4 and isinstance(value, (list, tuple)):
        return all(_is_plain(item, depth + 1) for item in value)
    if depth < 4 and isinstance(value, dict):
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    return False
