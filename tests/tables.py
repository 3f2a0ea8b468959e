"""Decision tables shared by every backend: each step is (seconds after T0, method,
arguments, expected answer). The expectations are worked out by hand from each
algorithm's definition (GCRA's from redis-cell's own test table), never by the code.

A step's method is a ``Funnel`` method's name, or an operation (a ``scripts.Op``
class, built as ``op(key, **arguments)``) answered through ``Funnel.decide``: a limiter
kind with no method of its own (docs/architecture.md, "Recipe: add a limiter kind")
adds its table here and every table test runs it.

Decision rows are (limited, limit, remaining, retry_after, reset_after, granted);
Reservation rows are (admitted, delay, booked, limit, reset_after, stale).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from celery_funnel._limiter.strategies.allowance import AllowanceOp

T0 = 1_700_000_000  # divisible by every window length below, so windows align on it

Method = str | Callable[..., Any]  # a Funnel method's name, or a scripts.Op class
Row = tuple[float, Method, dict[str, Any], tuple[Any, ...]]


def rows(
    table: str, steps: Sequence[Row] | None = None
) -> list[tuple[str, Method, dict[str, Any], tuple[Any, ...]]]:
    """``table``'s steps (or ``steps``, named ``table``) as (label, method, arguments
    with ``now``, expected answer)."""
    return [
        (f"{table} step {n}: {getattr(method, '__name__', method)}({kwargs}) at +{offset}s",
         method, {**kwargs, "now": T0 + offset}, expected)
        for n, (offset, method, kwargs, expected) in enumerate(
            TABLES[table] if steps is None else steps
        )
    ]  # fmt: skip


def play(funnel: Any, key: str, method: Method, kwargs: dict[str, Any]) -> Any:
    """One step on ``funnel`` (a ``Funnel`` or an ``AsyncRedisFunnel``: then awaitable):
    its method by name, or the operation ``method(key, **kwargs)`` through ``decide``."""
    if isinstance(method, str):
        return getattr(funnel, method)(key, **kwargs)
    answers = funnel.decide([method(key, **kwargs)])
    return _first(answers) if inspect.isawaitable(answers) else answers[0]


async def _first(answers: Awaitable[list[Any]]) -> Any:
    return (await answers)[0]


def answer_row(answer: Any) -> tuple[Any, ...]:
    """An answer as a table row: a Decision or Reservation is one; a number, a 1-tuple."""
    return tuple(answer) if isinstance(answer, tuple) else (answer,)


def _throttle(max_burst: int, count: int, period: float, q: int) -> dict[str, Any]:
    return {"max_burst": max_burst, "count": count, "period": period, "quantity": q}


def _cell(q: int) -> dict[str, Any]:
    return _throttle(4, 1, 1, q)  # redis-cell's it_rate_limits: limit 5, 1 per second


GCRA_REDIS_CELL: list[Row] = [
    (0, "throttle", _cell(6), (True, 5, 5, -1.0, 0.0, 0)),  # never fits
    (0, "throttle", _cell(1), (False, 5, 4, -1.0, 1.0, 1)),
    (0, "throttle", _cell(1), (False, 5, 3, -1.0, 2.0, 1)),
    (0, "throttle", _cell(1), (False, 5, 2, -1.0, 3.0, 1)),
    (0, "throttle", _cell(1), (False, 5, 1, -1.0, 4.0, 1)),
    (0, "throttle", _cell(1), (False, 5, 0, -1.0, 5.0, 1)),
    (0, "throttle", _cell(1), (True, 5, 0, 1.0, 5.0, 0)),
    (3.0, "throttle", _cell(1), (False, 5, 2, -1.0, 3.0, 1)),
    (3.1, "throttle", _cell(1), (False, 5, 1, -1.0, 3.9, 1)),
    (4.0, "throttle", _cell(1), (False, 5, 1, -1.0, 4.0, 1)),
    (8.0, "throttle", _cell(1), (False, 5, 4, -1.0, 1.0, 1)),
    (9.5, "throttle", _cell(1), (False, 5, 4, -1.0, 1.0, 1)),
    (9.5, "throttle", _cell(0), (False, 5, 4, -1.0, 1.0, 0)),  # peek
    (9.5, "throttle", _cell(2), (False, 5, 2, -1.0, 3.0, 2)),
    (9.5, "throttle", _cell(5), (True, 5, 2, 3.0, 3.0, 0)),
]


def _seed(q: int) -> dict[str, Any]:
    return _throttle(15, 30, 60, q)  # "cl.throttle user123 15 30 60 q" of seed 002


# The seed's transcript at exact times: T = 2 s, tau = 32 s, limit 16.
GCRA_SEED_002: list[Row] = [
    (0, "throttle", _seed(1), (False, 16, 15, -1.0, 2.0, 1)),
    (2, "throttle", _seed(4), (False, 16, 12, -1.0, 8.0, 4)),
    (4, "throttle", _seed(4), (False, 16, 9, -1.0, 14.0, 4)),
    (6, "throttle", _seed(4), (False, 16, 6, -1.0, 20.0, 4)),
    (7, "throttle", _seed(4), (False, 16, 2, -1.0, 27.0, 4)),
    (8, "throttle", _seed(4), (True, 16, 3, 2.0, 26.0, 0)),
    (10, "throttle", _seed(4), (False, 16, 0, -1.0, 32.0, 4)),
    (10, "throttle", _seed(17), (True, 16, 0, -1.0, 32.0, 0)),  # above the limit
    (100, "throttle", _seed(17), (True, 16, 16, -1.0, 0.0, 0)),  # idle again
]


def _fw(q: int, partial: bool = False, limit: int = 3) -> dict[str, Any]:
    return {"limit": limit, "period": 10, "quantity": q, "partial": partial}


FIXED_WINDOW: list[Row] = [
    (0, "fixed_window", _fw(1), (False, 3, 2, -1.0, 10.0, 1)),
    (1, "fixed_window", _fw(2), (False, 3, 0, -1.0, 9.0, 2)),
    (2, "fixed_window", _fw(1), (True, 3, 0, 8.0, 8.0, 0)),
    (2, "fixed_window", _fw(4), (True, 3, 0, -1.0, 8.0, 0)),  # above the limit
    (10, "fixed_window", _fw(2), (False, 3, 1, -1.0, 10.0, 2)),  # next window
]

FIXED_WINDOW_PARTIAL: list[Row] = [
    (0, "fixed_window", _fw(3, True, 5), (False, 5, 2, -1.0, 10.0, 3)),
    (5, "fixed_window", _fw(4, True, 5), (True, 5, 0, 5.0, 5.0, 2)),  # 2 of 4 granted
    (6, "fixed_window", _fw(0, True, 5), (False, 5, 0, -1.0, 4.0, 0)),  # peek
    (6, "fixed_window", _fw(7, True, 5), (True, 5, 0, -1.0, 4.0, 0)),
    (10, "fixed_window", _fw(7, True, 5), (True, 5, 0, 10.0, 10.0, 5)),  # rest 2 fits later
]


def _log(q: int) -> dict[str, Any]:
    return {"limit": 3, "period": 10, "quantity": q}


SLIDING_LOG: list[Row] = [
    (0, "sliding_log", _log(1), (False, 3, 2, -1.0, 10.0, 1)),
    (1, "sliding_log", _log(1), (False, 3, 1, -1.0, 10.0, 1)),
    (2, "sliding_log", _log(1), (False, 3, 0, -1.0, 10.0, 1)),
    (3, "sliding_log", _log(1), (True, 3, 0, 7.0, 9.0, 0)),  # the unit of t=0 leaves at 10
    (9.5, "sliding_log", _log(2), (True, 3, 0, 1.5, 2.5, 0)),  # needs t=0 and t=1 gone
    (10, "sliding_log", _log(1), (False, 3, 0, -1.0, 10.0, 1)),
    (10, "sliding_log", _log(4), (True, 3, 0, -1.0, 10.0, 0)),  # above the limit
    (10, "sliding_log", _log(0), (False, 3, 0, -1.0, 10.0, 0)),  # peek
    (25, "sliding_log", _log(3), (False, 3, 0, -1.0, 10.0, 3)),  # 3 units, one microsecond
    (25, "sliding_log", _log(0), (False, 3, 0, -1.0, 10.0, 0)),
]


def _sw(q: int, partial: bool = False) -> dict[str, Any]:
    return {"limit": 4, "period": 10, "quantity": q, "windows": 5, "partial": partial}


# Sub-windows of 2 s; c0 is the one starting at T0.
SLIDING_WINDOW: list[Row] = [
    (0, "sliding_window", _sw(2), (False, 4, 2, -1.0, 10.0, 2)),
    (3, "sliding_window", _sw(1), (False, 4, 1, -1.0, 9.0, 1)),
    (4, "sliding_window", _sw(2), (True, 4, 1, 6.0, 8.0, 0)),  # c0 leaves at 10
    (4, "sliding_window", _sw(2, True), (True, 4, 0, 6.0, 10.0, 1)),  # 1 of 2 granted
    (10, "sliding_window", _sw(2), (False, 4, 0, -1.0, 10.0, 2)),
    (11.5, "sliding_window", _sw(1), (True, 4, 0, 0.5, 8.5, 0)),  # c0+1 leaves at 12
    (12, "sliding_window", _sw(1), (False, 4, 0, -1.0, 10.0, 1)),
    (12, "sliding_window", _sw(5), (True, 4, 0, -1.0, 10.0, 0)),  # above the limit
]


def _res(ticket: str = "", redeem: bool = False, q: int = 1, **extra: Any) -> dict[str, Any]:
    args = _throttle(0, 10, 1, q)  # limit 1, T = 0.1 s
    return {**args, "ticket": ticket or None, "redeem": redeem, **extra}


RESERVATION: list[Row] = [
    (0, "reserve", _res("a"), (True, 0.0, False, 1, 0.1, False)),
    (0, "reserve", _res("b"), (False, 0.1, True, 1, 0.2, False)),
    (0, "reserve", _res("c"), (False, 0.2, True, 1, 0.3, False)),
    (0, "throttle", _throttle(0, 10, 1, 1), (True, 1, 0, 0.3, 0.3, 0)),  # sees the bookings
    (0.04, "reserve", _res("b", True), (False, 0.06, True, 1, 0.26, False)),  # too early
    (0.05, "reserve", _res("b", True), (True, 0.0, False, 1, 0.25, False)),  # redeemed
    (0.05, "reserve", _res("b", True), (False, 0.25, True, 1, 0.35, False)),  # only once: rebooked
    (0.5, "reserve", _res("c", True), (True, 0.0, False, 1, 0.1, True)),  # stale: rebooked, idle
    (0.5, "reserve", _res("d", max_wait=0.05), (False, 0.1, False, 1, 0.1, False)),  # too far
    (0.5, "reserve", _res("e", q=2), (False, -1.0, False, 1, 0.1, False)),  # never fits
    (0.5, "reserve", _res("b", True), (False, 0.1, True, 1, 0.2, True)),  # stale, rebooked
]

# The ticket window's edges: default early = min(slot width, 0.05 s) = 0.05 s, and
# late = slot width = 0.1 s. A redeemed ticket leaves the TAT alone (reset_after from
# the old TAT); a stale one books afresh (reset_after 0.1 when the funnel is idle).
RESERVATION_EDGES: list[Row] = [
    (0, "reserve", _res("a"), (True, 0.0, False, 1, 0.1, False)),
    (0, "reserve", _res("b"), (False, 0.1, True, 1, 0.2, False)),
    (0, "reserve", _res("c"), (False, 0.2, True, 1, 0.3, False)),
    (0.049999, "reserve", _res("b", True), (False, 0.050001, True, 1, 0.250001, False)),
    (0.05, "reserve", _res("b", True), (True, 0.0, False, 1, 0.25, False)),
    (0.3, "reserve", _res("c", True), (True, 0.0, False, 1, 0.0, False)),  # slot + late: honoured
    (0.3, "reserve", _res("d"), (True, 0.0, False, 1, 0.1, False)),
    (0.3, "reserve", _res("e"), (False, 0.1, True, 1, 0.2, False)),
    (0.500001, "reserve", _res("e", True), (True, 0.0, False, 1, 0.1, True)),  # stale: booked anew
]

# Priority: limit 1, T = 0.1 s; rank 0 most urgent. A booking takes the earliest future
# slot of a less urgent ticket (no TAT moves: reset_after stays); the displaced ticket,
# redeemed, finds itself gone and books again, itself displacing a less urgent one.
RESERVATION_PRIORITY: list[Row] = [
    (0, "reserve", _res("a", rank=9), (True, 0.0, False, 1, 0.1, False)),
    (0, "reserve", _res("b", rank=9), (False, 0.1, True, 1, 0.2, False)),
    (0, "reserve", _res("c", rank=9), (False, 0.2, True, 1, 0.3, False)),
    (0, "reserve", _res("d", rank=5), (False, 0.1, True, 1, 0.3, False)),  # b's slot
    (0, "reserve", _res("e", rank=0), (False, 0.1, True, 1, 0.3, False)),  # d's slot
    (0, "reserve", _res("f", rank=9), (False, 0.3, True, 1, 0.4, False)),  # no less urgent
    (0, "reserve", _res("g", rank=9), (False, 0.4, True, 1, 0.5, False)),  # the tail
    (0, "reserve", _res("h", rank=0), (False, 0.2, True, 1, 0.5, False)),  # c's slot
    (0.05, "reserve", _res("b", True, rank=9), (False, 0.45, True, 1, 0.55, False)),  # gone: tail
    (0.05, "reserve", _res("d", True, rank=5), (False, 0.25, True, 1, 0.55, False)),  # f's slot
    (0.05, "reserve", _res("e", True, rank=0), (True, 0.0, False, 1, 0.55, False)),  # redeemed
    (0.05, "reserve", _res("x"), (False, 0.55, True, 1, 0.65, False)),  # no rank: the tail
    (0.05, "reserve", _res("y", rank=0, max_wait=0.2), (False, 0.65, False, 1, 0.65, False)),
    (0.05, "reserve", _res("y", rank=0), (False, 0.25, True, 1, 0.65, False)),  # d's slot again
    (0.05, "reserve", _res("z", rank=1), (False, 0.35, True, 1, 0.65, False)),  # g's slot
    (0.05, "reserve", _res("w", rank=1), (False, 0.45, True, 1, 0.65, False)),  # b's; x has none
]

TABLES: dict[str, list[Row]] = {
    "gcra-redis-cell": GCRA_REDIS_CELL,
    "gcra-seed-002": GCRA_SEED_002,
    "fixed-window": FIXED_WINDOW,
    "fixed-window-partial": FIXED_WINDOW_PARTIAL,
    "sliding-log": SLIDING_LOG,
    "sliding-window": SLIDING_WINDOW,
    "reservation": RESERVATION,
    "reservation-edges": RESERVATION_EDGES,
    "reservation-priority": RESERVATION_PRIORITY,
}


# hold: limit 2, T = 0.5 s, tau = 1 s. A hold row's answer is the seconds until idle.
def _hold_shape(**extra: Any) -> dict[str, Any]:
    return {"max_burst": 1, "count": 2, "period": 1, **extra}


HOLD: list[Row] = [
    (0, "throttle", _hold_shape(quantity=1), (False, 2, 1, -1.0, 0.5, 1)),
    (0, "hold", _hold_shape(seconds=3), (3.5,)),  # next unit fits at 3: TAT 3 + tau - T
    (2.999999, "throttle", _hold_shape(quantity=1), (True, 2, 0, 0.000001, 0.500001, 0)),
    (3, "throttle", _hold_shape(quantity=1), (False, 2, 0, -1.0, 1.0, 1)),
    (3, "reserve", _hold_shape(ticket="z"), (False, 0.5, True, 2, 1.5, False)),
    # the booking is voided: the TAT drops back to one full funnel from now
    (3, "hold", _hold_shape(seconds=0.5), (1.0,)),
    (3.25, "reserve", _hold_shape(ticket="z", redeem=True), (False, 0.25, True, 2, 1.25, False)),
]
TABLES["hold"] = HOLD


# settle: 10/s (T = 0.1 s), capacity 5 (tau = 0.5 s). A settle row's answer is the
# seconds until the funnel is idle; units = actual - charged (below 0 gives back).
def _settle(units: int) -> dict[str, Any]:
    return {"count": 10, "period": 1, "units": units}


def _ten(q: int) -> dict[str, Any]:
    return _throttle(4, 10, 1, q)


SETTLE: list[Row] = [
    (0, "throttle", _ten(3), (False, 5, 2, -1.0, 0.3, 3)),
    (0, "settle", _settle(-2), (0.1,)),  # charged 3, used 1: two back at once
    (0, "throttle", _ten(4), (False, 5, 0, -1.0, 0.5, 4)),  # they fit at once
    (0.1, "settle", _settle(2), (0.6,)),  # used 2 more than charged: on top
    (0.1, "throttle", _ten(1), (True, 5, 0, 0.2, 0.6, 0)),
    (2, "settle", _settle(-3), (0.0,)),  # drained (expired): nothing to give back
    (2, "throttle", _ten(0), (False, 5, 5, -1.0, 0.0, 0)),
    (2, "settle", _settle(8), (0.8,)),  # a debt past tau, waited out
    (2, "throttle", _ten(1), (True, 5, 0, 0.4, 0.8, 0)),
    (2.3, "settle", _settle(-5), (0.0,)),  # back to idle, never below
    (2.3, "settle", _settle(0), (0.0,)),
    (2.3, "throttle", _ten(5), (False, 5, 0, -1.0, 0.5, 5)),
]
TABLES["settle"] = SETTLE


# align: 10/s (T = 0.1 s), capacity 5 (tau = 0.5 s). An align row's answer is the
# seconds until idle. A bucket quota caps what fits now; a window quota what fits
# before its reset; a TAT is never lowered.
def _align(remaining: int, reset: float = 0.0, window: bool = False) -> dict[str, Any]:
    return {"max_burst": 4, "count": 10, "period": 1, "remaining": remaining, "reset": reset,
            "window": window}  # fmt: skip


ALIGN: list[Row] = [
    (0, "align", _align(5), (0.0,)),  # 5 remain of 5: nothing to do
    (0, "align", _align(2), (0.3,)),  # 2 remain: 3 of our 5 are spent
    (0, "throttle", _ten(3), (True, 5, 2, 0.1, 0.3, 0)),
    (0, "throttle", _ten(2), (False, 5, 0, -1.0, 0.5, 2)),
    (0, "align", _align(4), (0.5,)),  # the funnel is stricter already: left alone
    (1, "align", _align(1, 2.0, True), (2.4,)),  # 1 left in a window resetting at +3
    (1, "throttle", _ten(1), (True, 5, 0, 2.0, 2.4, 0)),
    (3, "throttle", _ten(1), (False, 5, 0, -1.0, 0.5, 1)),  # the window reset
    (10, "align", _align(50, 1.0, True), (0.0,)),  # more than we hold: nothing to do
]
TABLES["align"] = ALIGN


# adapt: a limit of 10/s (T = 0.1 s), min 1/s, a 429 halves the rate, a success adds
# 2/s, one drop per second and a climb a second after a change, a 429's rate caps the
# climb for 10 s. An adapt row's answer is (seconds per unit in force, whether the call
# changed it); worked out from rate = 1 / T: 1/0.8 + 2 = 3.25/s (T 0.307692), and so
# on. A 429 under the last one's rate remembers (1 + 0.5) / 2 of its rate as the cap.
def _adapt(refused: bool) -> dict[str, Any]:
    from celery_funnel._limiter.rate import Rate
    from celery_funnel._limiter.strategies.adapt import Adaptive

    rule = Adaptive(Rate(1, 1), 0.5, Rate(2, 1), every=1.0, probe=10.0)
    return {"field": "f", "refused": refused, "adaptive": rule, "rate": Rate(10, 1)}


ADAPT: list[Row] = [
    (0, "adapt", _adapt(False), (0.1, False)),  # at its max: nothing to climb
    (0, "adapt", _adapt(True), (0.2, True)),  # halved: 5/s, capped below 10/s
    (0.5, "adapt", _adapt(True), (0.2, False)),  # the same burst of 429s: once
    (0.9, "adapt", _adapt(False), (0.2, False)),  # within a second of the change
    (1, "adapt", _adapt(True), (0.4, True)),  # 2.5/s; under 10/s: remembers 3.75/s
    (2, "adapt", _adapt(False), (0.4, False)),  # 4.5/s capped at 3.75 - 2 = 1.75/s
    (2.5, "adapt", _adapt(True), (0.8, True)),  # a climb never delays a drop
    (3, "adapt", _adapt(False), (0.8, False)),  # within a second of the drop
    (3.5, "adapt", _adapt(False), (0.8, False)),  # capped (remembers 1.875/s)
    (12.5, "adapt", _adapt(False), (0.307692, True)),  # the cap is forgotten after 10 s
    (13.5, "adapt", _adapt(False), (0.190476, True)),
    (14.5, "adapt", _adapt(False), (0.13793, True)),
    (15.5, "adapt", _adapt(False), (0.108107, True)),
    (16.5, "adapt", _adapt(False), (0.1, True)),  # back at its max (the field is gone)
    (17.5, "adapt", _adapt(False), (0.1, False)),
    (17.5, "adapt", _adapt(True), (0.2, True)),
    (18.5, "adapt", _adapt(True), (0.4, True)),
    (19.5, "adapt", _adapt(True), (0.8, True)),
    (20.5, "adapt", _adapt(True), (1.0, True)),  # never below min
    (21.5, "adapt", _adapt(True), (1.0, False)),
]
TABLES["adapt"] = ADAPT


# adapt-falling: 10/s, min 1/s, halved by a 429, +1/s a second, a cap for 100 s. A 429
# at 7/s, under the last one's 10/s: the limit fell, so the climb stops below
# 7 * (1 + 0.5) / 2 = 5.25/s (one step under it: 4.25/s), not below 7/s.
def _falling(refused: bool) -> dict[str, Any]:
    from celery_funnel._limiter.rate import Rate
    from celery_funnel._limiter.strategies.adapt import Adaptive

    rule = Adaptive(Rate(1, 1), 0.5, Rate(1, 1), every=1.0, probe=100.0)
    return {"field": "f", "refused": refused, "adaptive": rule, "rate": Rate(10, 1)}


ADAPT_FALLING: list[Row] = [
    (0, "adapt", _falling(True), (0.2, True)),  # 5/s, capped below 10/s
    (1, "adapt", _falling(False), (0.166666, True)),  # 6/s
    (2, "adapt", _falling(False), (0.142856, True)),  # 7/s
    (3, "adapt", _falling(True), (0.285712, True)),  # 3.5/s; remembers 5.25/s
    (4, "adapt", _falling(False), (0.235292, True)),  # 4.5/s capped at 4.25/s
    (5, "adapt", _falling(False), (0.235292, False)),
]
TABLES["adapt-falling"] = ADAPT_FALLING


# allowance: 100/s (T = 0.01 s), capacity 10 (tau = 0.1 s). k units are taken when the
# TAT after them is at most tau / 2 ahead; else one run is decided as reserve's step
# (admitted, or booked). A row's answer is (units taken, delay, booked, reset_after).
def _allowance(k: int, ticket: str) -> dict[str, Any]:
    return {"max_burst": 9, "count": 100, "period": 1, "k": k, "ticket": ticket}


ALLOWANCE: list[Row] = [
    (0, AllowanceOp, _allowance(5, "a"), (5, 0.0, False, 0.05)),  # exactly half free after
    (0, AllowanceOp, _allowance(5, "b"), (1, 0.0, False, 0.06)),  # past half: one run
    (0.06, AllowanceOp, _allowance(5, "c"), (5, 0.0, False, 0.05)),  # drained: 5 again
    (0.06, AllowanceOp, _allowance(2, "d"), (1, 0.0, False, 0.06)),  # 0.07 > half: one
    (0.06, AllowanceOp, _allowance(1, "e"), (1, 0.0, False, 0.07)),  # k = 1: reserve's step
    (0.06, AllowanceOp, _allowance(9, "f"), (1, 0.0, False, 0.08)),
    (0.06, AllowanceOp, _allowance(9, "g"), (1, 0.0, False, 0.09)),
    (0.06, AllowanceOp, _allowance(9, "h"), (1, 0.0, False, 0.1)),  # the funnel is full
    (0.06, AllowanceOp, _allowance(9, "i"), (0, 0.01, True, 0.11)),  # booked, as reserve
    (1, AllowanceOp, _allowance(64, "j"), (1, 0.0, False, 0.01)),  # more than tau: one
]
TABLES["allowance"] = ALLOWANCE
