"""Where the broker's Redis last saw a lost task, read from its append-only file.

kombu's Redis transport takes a message off its queue with BRPOP and records it as
un-acked (``HSET unacked``) only once the worker has read it: a broker killed between
the two has taken the message off the queue for good (for plain Celery too, and for
any message kombu delivers, a task's retry included). The file says whether that is
what happened to a lost task: its message was popped and never written to ``unacked``,
and no write reached the file between that pop and the broker's death. Each restart
shows in the file as a ``SELECT``: Redis selects the database again before the first
write it propagates after it starts.

``celery_funnel.transport`` takes a message in one script call that writes ``unacked``
first and then trims the message off its list (``LTRIM key 0 -2``): the file holds the
script's effects, so that pop comes recorded (never lost at a pop).

Only what the two transports do to a queue is followed (pushes, pops and deletes of
the queue's lists, writes of ``unacked``); the file of a broker that other clients
wrote in other ways is not read here.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Fate", "fates", "read_commands"]

SELECT = b"SELECT"


def _files(directory: Path) -> list[Path]:
    """The append-only files of a Redis data directory, in the order Redis replays them
    (6.x: one file; 7.x: the manifest's base, then its increments)."""
    single = directory / "appendonly.aof"
    if single.is_file():
        return [single]
    parts = directory / "appendonlydir"
    manifest = next(iter(parts.glob("*.manifest")), None)
    if manifest is None:
        return []
    files = []
    for line in manifest.read_text().splitlines():
        words = line.split()
        fields = dict(zip(words[::2], words[1::2], strict=False))
        if fields.get("type") in ("b", "i"):
            files.append(parts / fields["file"])
    return files


def _parse(data: bytes) -> Iterator[list[bytes]]:
    """The commands of one append-only file in RESP (an RDB preamble yields nothing)."""
    if data.startswith(b"REDIS"):
        return
    at = 0
    while at < len(data):
        if data[at : at + 1] == b"#":  # an annotation (7.x timestamps)
            at = data.index(b"\r\n", at) + 2
            continue
        end = data.find(b"\r\n", at)
        if data[at : at + 1] != b"*" or end < 0:
            return  # a truncated tail: what Redis loads with aof-load-truncated
        count, at, command = int(data[at + 1 : end]), end + 2, []
        for _ in range(count):
            end = data.find(b"\r\n", at)
            if end < 0:
                return
            size = int(data[at + 1 : end])
            command.append(data[end + 2 : end + 2 + size])
            at = end + 2 + size + 2
        if len(command) == count:
            yield command


def read_commands(directory: Path) -> list[list[bytes]]:
    """Every command the append-only files of ``directory`` hold, in order."""
    return [c for path in _files(directory) for c in _parse(path.read_bytes())]


@dataclass(frozen=True)
class Fate:
    """What the broker's file says of one task's messages: ``pushed`` (times a message
    of it went on a queue), ``popped`` (taken off), ``unacked`` (recorded as
    delivered); ``lost_at_a_pop`` when its last message was popped and never recorded
    as delivered after (it never reached a worker's Celery: kombu records a message
    before it hands it on), and then ``writes_before_death``: the writes the broker
    made between that pop and its death (or the end of the file); ``restored``: the
    pushes of a message recorded as delivered before (kombu's restore of an un-acked
    message puts it back: the broker gives it again)."""

    pushed: int = 0
    popped: int = 0
    unacked: int = 0
    lost_at_a_pop: bool = False
    writes_before_death: int | None = None
    restored: int = 0


def _task_id(body: bytes) -> tuple[str, str]:
    """The task id and delivery tag of a message as kombu's Redis transport stores it."""
    with_tag = json.loads(body)
    message = with_tag[0] if isinstance(with_tag, list) else with_tag
    tag = str(message.get("properties", {}).get("delivery_tag", ""))
    return str(message.get("headers", {}).get("id", "")), tag


def _pops(verb: bytes, args: list[bytes]) -> bool:
    """Whether a command takes one message off a list's end: kombu's RPOP (BRPOP as the
    file has it), or the fetch's LTRIM of the last element."""
    return verb in (b"RPOP", b"LPOP") or (verb == b"LTRIM" and args[1:] == [b"0", b"-2"])


def fates(commands: list[list[bytes]], queues: set[str]) -> dict[str, Fate]:
    """The fate of every task whose messages went through ``queues`` (list keys)."""
    lists: dict[bytes, deque[bytes]] = {q.encode(): deque() for q in queues}
    counts: dict[str, list[int]] = {}
    restored: dict[str, int] = {}
    last_pop: dict[str, tuple[int, str]] = {}  # task id: (position, delivery tag)
    recorded: dict[str, int] = {}  # delivery tag: where it was last written to unacked
    pushed_at: dict[str, int] = {}  # delivery tag: where it was last pushed on a queue
    for i, (name, *args) in enumerate(commands):
        verb = name.upper()
        if verb in (b"LPUSH", b"RPUSH") and args[0] in lists:
            for body in args[1:]:
                (lists[args[0]].appendleft if verb == b"LPUSH" else lists[args[0]].append)(body)
                task_id, tag = _task_id(body)
                counts.setdefault(task_id, [0, 0, 0])[0] += 1
                pushed_at[tag] = i
                if tag in recorded:
                    restored[task_id] = restored.get(task_id, 0) + 1
        elif _pops(verb, args) and args[0] in lists and lists[args[0]]:
            body = lists[args[0]].popleft() if verb == b"LPOP" else lists[args[0]].pop()
            task_id, tag = _task_id(body)
            counts.setdefault(task_id, [0, 0, 0])[1] += 1
            last_pop[task_id] = (i, tag)
            if verb == b"LTRIM" and recorded.get(tag, -1) > pushed_at.get(tag, -1):
                recorded[tag] = i  # the fetch's record, written in the same call
        elif verb == b"DEL" and args[0] in lists:
            lists[args[0]].clear()
        elif verb == b"HSET" and args[0] == b"unacked":
            for field, body in zip(args[1::2], args[2::2], strict=True):
                recorded[field.decode()] = i
                counts.setdefault(_task_id(body)[0], [0, 0, 0])[2] += 1
    restarts = [i for i, c in enumerate(commands) if c[0].upper() == SELECT and i > 0]
    result = {}
    for task_id, (pushed, popped, unacked) in counts.items():
        at, tag = last_pop.get(task_id, (-1, ""))
        again = restored.get(task_id, 0)
        if at < 0 or recorded.get(tag, -1) >= at:  # (at: the fetch, recorded as it took)
            result[task_id] = Fate(pushed, popped, unacked, restored=again)
            continue
        died = next((r for r in restarts if r > at), len(commands))
        result[task_id] = Fate(pushed, popped, unacked, True, died - at - 1, again)
    return result
