"""What Redis's scripts do, as the server ran it (``MONITOR``): the funnel's own
decisions on Redis's clock (``FunnelLog``), for tests that must not depend on how fast
a loaded machine runs the workers; and every key a script touched against the keys it
was given (``ScriptKeys``).

A GCRA funnel is one string, its TAT (theoretical arrival time, µs): every run admitted
or slot booked moves it one increment (``T x cost``) later, in a script that reads the
server's ``TIME``. ``MONITOR`` shows each command a script runs, stamped with the
server's clock as it runs: so each ``SET`` of the TAT is one decision, in the order the
scripts ran, at (a few µs after) the ``now`` the script decided at. The times a worker
or a task sees (a start, a signal) add the machine's delays; these do not.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from tests.polling import wait_for

US = 1_000_000
Seen = TypeVar("Seen", bound="Monitor")
# KEYS: the funnel keys to read; ARGV[1]: a mark for the monitor (ignored here)
# reply: key, TAT (µs) pairs, for the keys that are strings (a funnel's TAT)
SNAPSHOT = """
local out = {}
for _, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok == 'string' then
    local value = redis.call('GET', key)
    if tonumber(value) then
      out[#out + 1] = key
      out[#out + 1] = value
    end
  end
end
return out
"""


@dataclass(frozen=True)
class Write:
    """One ``SET`` of a funnel's TAT by a script: when Redis ran it (epoch seconds,
    Redis's clock), the key, the TAT written (epoch seconds), and the connection whose
    script wrote it (one worker's: a worker's connections are its own)."""

    at: float
    key: str
    tat: float
    caller: str = ""
    command: tuple[str, ...] = ()  # the caller's command: EVALSHA sha numkeys keys args

    @property
    def sha(self) -> str:
        """The SHA1 of the script that wrote it ("" when not run by EVALSHA)."""
        return self.command[1] if self.command[:1] == ("EVALSHA",) else ""

    def argv(self, n: int) -> str:
        """ARGV[``n``] (from 1) of the ``EVALSHA`` that wrote it (``reserve.lua``'s
        ARGV[2] is the ticket: the task id)."""
        return self.command[3 + int(self.command[2]) + n - 1]


class Monitor:
    """A thread reading ``MONITOR`` on the Redis at ``url``; each command it sees goes to
    ``note`` (Redis's time; its connection, "host:port", or "lua" for a script's call;
    its words)."""

    def __init__(self, url: str) -> None:
        self.url = url
        # no read timeout: a quiet server (a test starting its processes) sends the
        # monitor nothing for a while; redis-py 8 reads with a 5 s timeout by default
        self._client = redis.Redis.from_url(url, socket_timeout=None)
        self._stop = threading.Event()
        self._marks: set[str] = set()
        self._count = itertools.count()
        self._thread = threading.Thread(target=self._read, name="funnel-log", daemon=True)
        self.error: BaseException | None = None

    def _read(self) -> None:
        try:
            with self._client.monitor() as monitor:
                while not self._stop.is_set():  # stop() sends a command to end the wait
                    seen = monitor.next_command()
                    # redis-py joins the words (unquoted) with spaces
                    words = seen["command"].split(" ")
                    if words[:1] == ["ECHO"] and len(words) == 2:
                        self._marks.add(words[1])
                    lua = seen.get("client_type") == "lua"
                    client = (
                        "lua" if lua else f"{seen.get('client_address')}:{seen.get('client_port')}"
                    )
                    self.note(seen["time"], client, words)
        except BaseException as error:  # reported by the test that reads the log
            if not self._stop.is_set():
                self.error = error

    def note(self, at: float, client: str, words: list[str]) -> None:
        """One command seen."""

    def start(self) -> None:
        """Start monitoring; returns once the monitor sees commands."""
        self._thread.start()
        self.sync(again=True)  # the first marks may come before MONITOR is on

    def sync(self, timeout: float = 60.0, again: bool = False) -> None:
        """Return once every command Redis ran before this call is in the log (a mark
        sent now came through the monitor); ``again``: send marks until one does."""
        marks = (f"funnel-log-{id(self)}-{n}" for n in self._count)
        with redis.Redis.from_url(self.url) as probe:
            mark = next(marks)
            probe.echo(mark)

            def seen() -> bool:
                nonlocal mark
                if mark in self._marks or self.error is not None:
                    return True
                if again:
                    mark = next(marks)
                    probe.echo(mark)
                return False

            wait_for(seen, timeout)
        self.check()

    def stop(self) -> None:
        if self._thread.is_alive() and self.error is None:
            self.sync()
        self._stop.set()
        with redis.Redis.from_url(self.url) as probe:  # the reader waits for a command
            probe.echo("funnel-log-stop")
        self._thread.join(10)
        self._client.close()

    def check(self) -> None:
        """Fail if the monitor stopped before it was told to."""
        assert self.error is None, f"MONITOR failed: {self.error!r}"

    def __enter__(self: Seen) -> Seen:
        """Monitoring while the block runs."""
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FunnelLog(Monitor):
    """The writes seen so far (``writes``) of the funnel keys starting with
    ``prefix``."""

    def __init__(self, url: str, prefix: str) -> None:
        super().__init__(url)
        self.prefix = prefix
        self.writes: list[Write] = []
        self._caller = ""
        self._command: tuple[str, ...] = ()
        self._snapshot = f"funnel-log-snapshot-{id(self)}"
        self._first = 0  # writes before the snapshot ran are in it, not in the log
        self._tats: dict[str, float] = {}

    def start(self) -> None:
        """Start monitoring, from a snapshot of every funnel's TAT under the prefix,
        taken by one script (atomic, and in the monitor's order): a test may start on a
        funnel an earlier test left booked ahead, and its first decision moves from that
        TAT, not from 0."""
        super().start()
        with redis.Redis.from_url(self.url) as probe:
            keys = [k.decode() for k in probe.scan_iter(match=self.prefix + "*", count=1000)]
            values = probe.eval(SNAPSHOT, len(keys), *keys, self._snapshot)
        pairs = zip(values[::2], values[1::2], strict=True)
        self._tats = {key.decode(): int(value) / US for key, value in pairs}
        self.sync()  # the snapshot is in the log: writes before it are dropped

    def first_tat(self, key: str) -> float:
        """The TAT of ``key`` (epoch seconds) when the log started; 0.0 if it had none."""
        return self._tats.get(key, 0.0)

    def note(self, at: float, client: str, words: list[str]) -> None:
        if client != "lua":
            # a script's calls come right after it (Redis 6.2, 7)
            self._caller, self._command = client, tuple(words)
            if words[-1:] == [self._snapshot]:
                self._first = len(self.writes)
        elif words[:1] == ["SET"] and len(words) >= 3 and words[1].startswith(self.prefix):
            tat = int(words[2]) / US
            self.writes.append(Write(at, words[1], tat, self._caller, self._command))

    def steps(self, key: str | None = None) -> list[tuple[Write, float]]:
        """Each write of ``key`` (None: the only key written) with how far it moved the
        TAT: from the later of the TAT before and the time it ran (a run admitted moves
        it one increment, T x cost, from its ``now``; a booking, from the TAT before)."""
        writes = self.decisions(key)
        assert len({w.key for w in writes}) <= 1, {w.key for w in writes}
        moved, before = [], self.first_tat(writes[0].key) if writes else 0.0
        for write in writes:
            moved.append((write, write.tat - max(before, write.at)))
            before = write.tat
        return moved

    def decisions(self, key: str | None = None) -> list[Write]:
        """The writes of ``key`` (None: of every key under the prefix), in order."""
        self.check()
        return [w for w in self.writes[self._first :] if key is None or w.key == key]


def one_slot_each(
    writes: Sequence[Write], slot: float, slack: float = 0.04, before: float = 0.0
) -> list[float]:
    """The slots ``writes`` (a funnel of capacity 1 charging ``slot`` seconds a run:
    T x cost) booked or admitted at, sorted; fails unless each write moved the TAT one
    slot: exactly from the TAT before it when that was still ahead (a busy funnel), or
    from the time it ran (an idle one: the script's now, at most ``slack``, and at most
    one slot, before Redis stamped the write). ``before``: the TAT when the writes
    began (``FunnelLog.first_tat``), 0.0 for a new funnel."""
    slack = min(slack, slot)
    odd: list[tuple[float, float]] = []
    for w in writes:
        busy = before > w.at
        if (busy and abs(w.tat - before - slot) > 2e-6) or (
            not busy and not slot - slack <= w.tat - w.at <= slot + 2e-6
        ):
            odd.append((w.tat - before, w.tat - w.at))
        before = w.tat
    assert odd == [], f"moves of no slot of {slot} s (from the TAT before, from now): {odd[:5]}"
    return sorted(max(w.at, w.tat - slot) for w in writes)


def started_early(starts: Sequence[float], slots: Sequence[float], early: float) -> list[Any]:
    """The starts (epoch seconds, any order) that came before their slot less the early
    grace ``early``: the n-th start may come no earlier than the n-th slot (a loaded
    machine only makes starts later); 5 ms for two clocks read on one machine."""
    pairs = zip(sorted(starts), sorted(slots), strict=False)
    return [(start, slot) for start, slot in pairs if start < slot - early - 0.005]


def bookings(writes: Sequence[Write], slot: float) -> dict[str, list[Write]]:
    """The writes of ``reserve.lua`` (a funnel of capacity 1, ``slot`` seconds a run)
    that booked a slot ahead (not admitted at once), by ticket (task id)."""
    found: dict[str, list[Write]] = {}
    for write in writes:
        if write.tat - slot > write.at:  # its slot ahead of the time it ran: booked
            found.setdefault(write.argv(2), []).append(write)
    return found


def booked_again_early(writes: Sequence[Write], slot: float) -> list[tuple[float, float]]:
    """Each booking of a ticket made while its previous slot could still be honoured
    (before that slot's late grace, the smallest ``reserve.lua`` was given, ARGV[5],
    had passed on Redis's clock): (the previous slot, the time of the new booking). A
    task that came back in its window redeems its slot; only a late one books again."""
    late = min(float(write.argv(5)) for write in writes) / US
    return [
        (before.tat - slot, after.at)
        for booked in bookings(writes, slot).values()
        for before, after in itertools.pairwise(booked)
        if after.at <= before.tat - slot + late
    ]


def funnel_log(url: str, prefix: str) -> FunnelLog:
    """A ``FunnelLog`` of the funnel keys starting with ``prefix`` on the Redis at
    ``url``, monitoring while the ``with`` block runs."""
    return FunnelLog(url, prefix)


# a script's calls whose every argument is a key, and those with none; any other
# command's key is its first argument
ALL_KEYS = {"DEL", "UNLINK", "EXISTS", "MGET", "TOUCH"}
NO_KEY = {"TIME", "PUBLISH", "ECHO", "PING"}


class ScriptKeys(Monitor):
    """Every key a script's call touched that the script was not given in KEYS
    (``undeclared``): what Dragonfly, ElastiCache Serverless and a Redis Cluster refuse.
    Independent of the scripts' text: it reads what ran. A call is the script's that
    the server reported just before it (``order`` finds whether the calls are reported
    after their script, as Redis 7 does, or before)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.declared: set[str] | None = None
        self.calls = 0
        self.undeclared: list[tuple[str, str]] = []  # (the call, its key)

    def note(self, at: float, client: str, words: list[str]) -> None:
        command = words[0].upper() if words else ""
        if client != "lua":
            if command == "EVALSHA" and len(words) >= 3:
                count = int(words[2])
                self.declared = set(words[3 : 3 + count])
                self.calls += 1
            elif command == "EVAL":  # its text has spaces: its keys cannot be read here
                self.declared = None
            return
        if command in NO_KEY:
            return
        keys = words[1:] if command in ALL_KEYS else words[1:2]
        for key in keys:
            if self.declared is None or key not in self.declared:
                self.undeclared.append((" ".join(words[:3]), key))


@contextmanager
def script_keys(url: str) -> Iterator[ScriptKeys]:
    """A ``ScriptKeys`` of the Redis at ``url`` while the block runs; first checked on
    a script given its key and one that touches a key it was not given (so a server
    that reports a script's calls in another order fails here, not silently)."""
    with ScriptKeys(url) as seen:
        with redis.Redis.from_url(url) as client:  # EVALSHA, as the package's calls
            client.register_script("return redis.call('EXISTS', KEYS[1])")(["script-keys-given"])
            client.register_script("return redis.call('EXISTS', 'script-keys-built')")()
        seen.sync()
        assert seen.undeclared == [("EXISTS script-keys-built", "script-keys-built")], (
            f"the monitor did not tie each script's calls to it: {seen.undeclared}"
        )
        seen.undeclared.clear()
        seen.calls = 0
        yield seen


class SeatLog(Monitor):
    """The seats of a concurrency funnel of ``n`` seats (its holders and waiters, the
    sorted sets ``concurrency_keys`` names) as Redis changed them: ``short``, each moment a
    script left a seat free while a waiter that holds none waited (none, when a freed
    seat goes to the first waiter in the call that frees it); ``handed``, when Redis
    handed each waiter its seat (epoch seconds, Redis's clock)."""

    def __init__(self, url: str, holders: str, waiters: str, n: int) -> None:
        super().__init__(url)
        self.keys, self.n = {holders: "holders", waiters: "waiters"}, n
        self.sets: dict[str, set[str]] = {"holders": set(), "waiters": set()}
        self.short: list[tuple[float, int, int]] = []  # (at, seats taken, waiting)
        self.handed: dict[str, float] = {}
        self.queued: dict[str, None] = {}

    def note(self, at: float, client: str, words: list[str]) -> None:
        if client != "lua":  # the script before this command has ended
            holders, waiters = self.sets["holders"], self.sets["waiters"]
            unseated = waiters - holders
            if unseated and len(holders) < self.n:
                self.short.append((at, len(holders), len(unseated)))
        name = self.keys.get(words[1]) if len(words) > 2 else None
        if name is None or words[0] not in ("ZADD", "ZREM"):
            return
        members = self.sets[name]
        if words[0] == "ZREM":
            members.difference_update(words[2:])
        elif "XX" not in words or words[-1] in members:  # a renewal adds none
            if name == "holders" and words[-1] in self.sets["waiters"]:
                self.handed.setdefault(words[-1], at)
            elif name == "waiters":
                self.queued.setdefault(words[-1], None)
            members.add(words[-1])
