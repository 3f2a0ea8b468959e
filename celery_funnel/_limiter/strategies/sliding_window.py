"""Sliding window of N sub-window counters (seed 004): smoother than one fixed window,
constant memory (N small counters), and exact to one sub-window.

The counters are the fields of one hash per funnel (field ``i mod N`` holds sub-window
``i``), so a funnel is one key whatever N: no key names to build per call, one slot on
Redis Cluster, and a fraction of the memory of a key per counter.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..decision import Decision
from ..errors import ConfigurationError
from ..memstore import MemoryStore
from ..scripts import Arg, Eval, Reply, Script, clock_arg, parse_now
from . import _window
from ._common import check_int, check_key, now_us, period_us
from ._registry import Spec, Strategy, register

MAX_WINDOWS = 100


def check_windows(windows: object) -> int:
    """``windows`` as an int from 1 to ``MAX_WINDOWS``, else ``ConfigurationError``."""
    if check_int("windows", windows, 1) > MAX_WINDOWS:
        raise ConfigurationError(f"windows must be at most {MAX_WINDOWS}, got {windows!r}")
    return windows  # type: ignore[return-value]


def _twin(store: MemoryStore, keys: Sequence[str], argv: Sequence[Arg]) -> Reply:
    limit, sub, quantity = int(argv[0]), int(argv[1]), int(argv[2])
    now = parse_now(argv[3], store)
    n = int(argv[5])
    current = now // sub
    live = [0] * n  # live[k]: sub-window current - n + 1 + k, oldest first
    for field, value in store.hgetall(keys[0]).items():
        index, units = (int(part) for part in value.split(":"))
        if current - n < index <= current and int(field) == index % n:
            live[index - current + n - 1] = units
    used = sum(live)
    granted = _window.grant(quantity, limit - used, str(argv[4]) == "1")
    if granted > 0:
        live[-1] += granted
        used += granted
        store.hset(keys[0], {str(current % n): f"{current}:{live[-1]}"})
        store.pexpire(keys[0], -(-((current + n) * sub - now) // 1000))
    retry_after, rest = -1, quantity - granted
    if 0 < rest <= limit:
        need, freed = used + rest - limit, 0
        for k, units in enumerate(live, start=1):
            freed += units
            if freed >= need:
                retry_after = (current + k) * sub - now
                break
    busy = [k for k, units in enumerate(live, start=1) if units > 0]
    return [granted, used, retry_after, (current + busy[-1]) * sub - now if busy else 0]


SCRIPT = Script.load("sliding_window", _twin, admitted=_window.ADMITTED)


def sliding_window(
    run: Eval,
    key: str,
    limit: int,
    period: float,
    quantity: int,
    windows: int,
    partial: bool,
    now: float | None,
) -> Decision:
    """One sliding-window decision through ``run``; see ``Funnel.sliding_window``."""
    check_key(key)
    check_int("quantity", quantity, 0)
    check_windows(windows)
    limit, span = period_us(limit, period)
    sub = -(-span // windows)  # rounded up: the window may be longer, never shorter
    args: list[Arg] = [
        limit, sub, quantity, clock_arg(now_us(now)), "1" if partial else "0", windows
    ]  # fmt: skip
    return _window.decision(limit, quantity, run(SCRIPT, (key,), args))


def _check(spec: Spec) -> None:
    check_windows(spec.windows)


register(
    Strategy(
        "sliding_window",
        decide=lambda funnel, key, spec, quantity: funnel.sliding_window(
            key, spec.rate.count, spec.rate.period, quantity, windows=spec.windows
        ),
        check=_check,
    )
)
