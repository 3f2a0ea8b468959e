"""What a fair-share funnel decided, in the order Redis ran it (``MONITOR``): each task
that joined its tenant's queue, each slot handed out (booked by a dispatcher's pass,
``fair_pop.lua``, or admitted at once by a gate when no task waited,
``fair_admit.lua``), and each dispatcher pass. Times are Redis's: a loaded machine
moves when workers start the tasks, not these.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery_funnel._limiter.keys import fair_keys
from tests.redis_monitor import US, Monitor

__all__ = ["FairLog", "Slot", "Wait", "fair_log", "passed_over"]

NUL = "\\x00"  # how MONITOR shows a NUL of a queue member (tenant\0rank+seq\0cost\0id)


@dataclass(frozen=True)
class Wait:
    """A task joined its tenant's queue (Redis's time, task id, tenant, priority rank)."""

    at: float
    task: str
    tenant: str
    rank: int


@dataclass(frozen=True)
class Slot:
    """A slot handed to a task: when Redis ran it, the task, its tenant, the slot
    (epoch seconds), and whether a pass booked it (False: a gate admitted it at once,
    no task waiting)."""

    at: float
    task: str
    tenant: str
    slot: float
    booked: bool = True


class FairLog(Monitor):
    """The fair funnel ``key``'s ``events`` (waits and slots) and ``passes`` (each
    dispatcher pass: Redis's time, the dispatcher's connection), in the order Redis
    ran them."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(url)
        keys = fair_keys(key)
        self.funnel, self.tickets, self.ids = keys[0], keys[1], keys[4]
        self.events: list[Wait | Slot] = []
        self.passes: list[tuple[float, str]] = []
        self._command: list[str] = []
        self._tenant: dict[str, str] = {}  # task id -> tenant, from its wait

    def note(self, at: float, client: str, words: list[str]) -> None:
        if client != "lua":  # a script's calls come right after it (Redis 6.2, 7)
            self._command = words
            ours = words[:1] == ["EVALSHA"] and len(words) > 3 and words[3] == self.funnel
            if ours and len(words) == 3 + 10 + 4:  # fair_pop.lua: 10 keys, 4 arguments
                self.passes.append((at, client))
            return
        if words[:2] == ["HSET", self.ids] and len(words) == 4:
            tenant, order, _cost, _id = words[3].split(NUL)
            self._tenant[words[2]] = tenant
            self.events.append(Wait(at, words[2], tenant, int(order[:2], 16)))
        elif words[:2] == ["ZADD", self.tickets] and self._is(4):
            task = words[3]
            self.events.append(Slot(at, task, self._tenant.get(task, ""), int(words[2]) / US))
        elif words[:2] == ["SET", self.funnel] and self._is(7):  # admitted, none waiting
            argv = self._command[3 + 10 :]  # its slot: the TAT written less one increment
            slot = (int(words[2]) - int(argv[2])) / US
            self.events.append(Slot(at, argv[1], argv[6], slot, booked=False))

    def _is(self, arguments: int) -> bool:
        """Whether the script running is a fair one taking ``arguments`` arguments
        (fair_pop.lua 4, fair_admit.lua 7)."""
        command = self._command
        return command[:1] == ["EVALSHA"] and len(command) == 3 + 10 + arguments

    @property
    def slots(self) -> list[Slot]:
        """The slots handed out, in the order Redis handed them."""
        self.check()
        return [event for event in self.events if isinstance(event, Slot)]


def fair_log(url: str, key: str) -> FairLog:
    """A ``FairLog`` of fair funnel ``key`` on the Redis at ``url``, monitoring while the
    ``with`` block runs."""
    return FairLog(url, key)


def passed_over(log: FairLog, tenant: str) -> list[tuple[str, int, int]]:
    """``tenant``'s tasks that more of the others' tasks went ahead of (slots handed to
    others between its joining its queue and its own slot) than stride order allows:
    one for each of its own tasks waiting ahead of it, and one more (a tie). Each:
    (task, others ahead, allowed)."""
    ahead: dict[str, int] = {}  # a waiting task of tenant -> others served since
    allowed: dict[str, int] = {}
    waiting: list[str] = []
    found = []
    for event in log.events:
        if isinstance(event, Wait):
            if event.tenant == tenant:
                ahead[event.task], allowed[event.task] = 0, len(waiting) + 1
                waiting.append(event.task)
            continue
        if event.tenant != tenant:
            for task in waiting:
                ahead[task] += 1
        elif event.task in waiting:
            waiting.remove(event.task)
            if ahead[event.task] > allowed[event.task]:
                found.append((event.task, ahead[event.task], allowed[event.task]))
    return found
