"""Settling one run (``FunnelTask.funnel_settle``), and aligning its named funnels
with what the upstream says remains (``FunnelTask.funnel_feedback``): the units it was charged at
admission, on the funnels named, become what it really used, at once for every worker.

The run remembers what each funnel holds for it (``Settled``): the estimate charged
at admission, then the amount of the last settle. Settling again settles relative to
that: the funnel always holds the last amount said. A run that ends without settling
leaves its estimate charged; a retry is a new run, charged and settled anew.

Every named funnel is settled in one round trip: one script when their keys may meet
in it (any standalone Redis; one hash tag on a Cluster, as a task's own limits share),
else one script per hash tag, pipelined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._config.runtime import Runtime
from .._limiter.errors import ConfigurationError
from .._limiter.headers import Quota
from .._limiter.keys import hash_tag
from .._limiter.strategies import capabilities
from .._limiter.strategies.align import Align, AlignOp
from .._limiter.strategies.settle import Settle, SettleOp
from .charges import Charge
from .charges_decide import joint

__all__ = ["Settled", "align", "resolve", "settle", "together"]

Settled = dict[int, int]
"""What each funnel of a run holds for it now, by the charge's index: its estimate
until the first settle, then the amount last settled."""


def resolve(
    task: str,
    charges: Sequence[Charge],
    own: int,
    actual: int | None,
    named: Mapping[str, int],
) -> dict[int, int]:
    """The charges' indexes and the actual units to settle on them: ``actual`` on the
    task's own funnel (its first own charge, when it has one own funnel or a
    ``funnel_rate``; ``own`` is how many of ``charges`` are the task's own, first),
    ``named`` by limit name.

    Raises:
        ConfigurationError: an unknown name, no own funnel, a bad amount, a window
            strategy (settling means nothing there: its units are counted, not timed).
    """
    wanted: dict[int, int] = {}
    if actual is not None:
        if own != 1 and not (own and charges[0].limit.name is None):
            raise ConfigurationError(
                f"funnel_settle({actual!r}) on task {task!r}: the task has {own} funnels of"
                f" its own; name the one to settle (funnel_settle(name=units))"
            )
        wanted[0] = actual
    names = {c.limit.name: i for i, c in enumerate(charges) if c.limit.name is not None}
    for name, units in named.items():
        if name not in names:
            raise ConfigurationError(
                f"funnel_settle({name}=...) on task {task!r}: no limit named {name!r}"
                f" (named: {sorted(names)})"
            )
        wanted[names[name]] = units
    for i, units in wanted.items():
        if isinstance(units, bool) or not isinstance(units, int) or units < 0:
            raise ConfigurationError(
                f"funnel_settle on task {task!r}: units must be an integer >= 0, got {units!r}"
            )
        if not capabilities(charges[i].limit.strategy).settles:
            raise ConfigurationError(
                f"funnel_settle on task {task!r}: limit {charges[i].limit.name or i!r} uses"
                f" {charges[i].limit.strategy!r}; only 'gcra' funnels can be settled"
            )
    return wanted


def settle(
    runtime: Runtime, charges: Sequence[Charge], held: Settled, wanted: Mapping[int, int]
) -> Settled:
    """Settle ``wanted`` (index -> actual units) against what ``held`` says each funnel
    holds for the run, in one round trip; the new ``held``.

    Raises:
        BackendError: when the funnels' Redis fails (nothing is settled then).
    """
    rows = {
        i: Settle(charges[i].key, charges[i].limit.rate.count, charges[i].limit.rate.period,
                  units - held.get(i, charges[i].cost))
        for i, units in wanted.items()
    }  # fmt: skip
    moving = [i for i, row in rows.items() if row.units]
    if moving:
        groups = together(runtime, [charges[i] for i in moving], moving)
        runtime.funnel.decide([SettleOp([rows[i] for i in group]) for group in groups])
    return {**held, **wanted}


def align(
    runtime: Runtime,
    charges: Sequence[Charge],
    quotas: Mapping[str, Quota],
    names: Mapping[str, str] | None = None,
) -> list[str]:
    """Bring the run's named GCRA funnels in line with the upstream's ``quotas`` (by
    the upstream's limit name, mapped to ours through ``names``; unmapped names are
    the same), in one round trip; the names of the funnels aligned.

    Raises:
        BackendError: when the funnels' Redis fails.
    """
    ours = {c.limit.name: i for i, c in enumerate(charges) if c.limit.name is not None}
    rows: dict[int, Align] = {}
    for theirs, quota in quotas.items():
        i = ours.get((names or {}).get(theirs, theirs), -1)
        limit = charges[i].limit if i >= 0 else None
        if limit is not None and capabilities(limit.strategy).aligns:
            rate = limit.rate
            rows[i] = Align(charges[i].key, limit.capacity - 1, rate.count, rate.period,
                            quota.remaining, quota.reset, quota.window)  # fmt: skip
    if rows:
        indexes = list(rows)
        groups = together(runtime, [charges[i] for i in indexes], indexes)
        runtime.funnel.decide([AlignOp([rows[i] for i in g]) for g in groups])
    return [str(charges[i].limit.name) for i in rows]


def together(runtime: Runtime, charges: Sequence[Charge], indexes: list[int]) -> list[list[int]]:
    """The indexes settled together: all at once when one script may hold them, else
    by hash tag (Redis Cluster)."""
    if joint(runtime, charges):
        return [indexes]
    by_tag: dict[str | None, list[int]] = {}
    for charge, i in zip(charges, indexes, strict=True):
        by_tag.setdefault(hash_tag(charge.key), []).append(i)
    return list(by_tag.values())
