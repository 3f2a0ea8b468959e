"""Every Lua script touches only keys passed in KEYS: Dragonfly and ElastiCache
Serverless refuse a script that touches any other key (Redis Cluster too, across slots).

Each ``celery_funnel/lua/*.lua`` is read as the loader runs it (the ``_*.lua`` preludes
prepended): the key argument of every ``redis.call``/``redis.pcall`` must be
``KEYS[...]``, or a name (a local, a loop variable, a function parameter, a table) whose
every definition in the script is such an expression, so a key built in Lua
(``KEYS[1] .. '#tickets'``) or taken from ARGV fails. Checked conservatively: names are
not scoped, so one bad definition of a name anywhere in a script makes every use of
that name fail.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

LUA = Path(__file__).resolve().parents[2] / "celery_funnel" / "lua"
SCRIPTS = sorted(p for p in LUA.glob("*.lua") if not p.name.startswith("_"))
PRELUDES = sorted(LUA.glob("_*.lua"))

NAME = r"[A-Za-z_]\w*"
# command -> the positions (0-based, after the command) of its key arguments
ALL = -1
SINGLE_KEY = [
    "GET", "SET", "PEXPIRE", "HGET", "HSET", "HDEL", "HEXISTS", "HINCRBY", "HMGET", "HGETALL",
    "ZADD", "ZREM", "ZCARD", "ZSCORE", "ZRANGE", "ZRANGEBYSCORE", "ZRANGEBYLEX",
    "ZREMRANGEBYSCORE", "ZREMRANGEBYRANK", "ZCOUNT", "PTTL", "EXISTS", "INCRBY", "EXPIRE", "TYPE",
    "ZREVRANGEBYSCORE", "LINDEX", "LTRIM", "RPOP",
]  # fmt: skip
KEY_ARGS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(SINGLE_KEY, (0,)),
    "DEL": (ALL,),
    "TIME": (),
    "PUBLISH": (),  # a channel, not a key
}


# an assignment, at a line's start or after do/then/else: targets, values
ASSIGNMENT = re.compile(
    rf"(?:^|\s(?:do|then|else)\s)\s*(?:local\s+)?"
    rf"({NAME}(?:\[[^\]=]*\])?(?:\s*,\s*{NAME})*)\s*=(?!=)\s*(.+)$"
)


def strip_comments(source: str) -> str:
    """``source`` without ``--`` comments (the scripts' strings hold no ``--``)."""
    return "\n".join(re.sub(r"--.*", "", line) for line in source.splitlines())


def split_args(text: str, start: int) -> tuple[list[str], int]:
    """The top-level comma-separated arguments of the call whose ``(`` is at ``start``,
    and the index after its ``)``."""
    depth, args, current, quote = 0, [], "", ""
    i = start + 1
    while i < len(text):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                args.append(current.strip())
                return [a for a in args if a], i + 1
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
            i += 1
            continue
        current += ch
        i += 1
    raise AssertionError(f"unbalanced call at {start}")


def calls(text: str, name: str) -> Iterator[list[str]]:
    """The argument lists of every call of ``name`` in ``text``."""
    for match in re.finditer(rf"(?<![\w.:]){re.escape(name)}\s*\(", text):
        yield split_args(text, match.end() - 1)[0]


def definitions(text: str) -> dict[str, list[str]]:
    """Name -> the expressions assigned to it: assignments (``local a, b = x, y``,
    ``t[i] = x`` counting for ``t``), ``for _, v in ipairs(t)`` (``t[...]`` for ``v``),
    and function parameters (the argument at their place in every call)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = ASSIGNMENT.search(line)
        if m:
            targets = [t.strip() for t in m[1].split(",")]
            values, _ = split_args(f"({m[2]})", 0)
            if re.fullmatch(r"(?:table\.)?unpack\(KEYS\)", values[0]):  # a, b = unpack(KEYS)
                values = [f"KEYS[{k + 1}]" for k in range(len(targets))]
            for k, target in enumerate(targets):
                value = values[k] if k < len(values) else "nil"
                found.setdefault(re.match(NAME, target)[0], []).append(value)  # type: ignore[index]
        m = re.match(rf"\s*for\s+{NAME}\s*,\s*({NAME})\s+in\s+i?pairs\((.+)\)\s+do", line)
        if m:
            found.setdefault(m[1], []).append(f"{m[2].strip()}[_]")
    for m in re.finditer(rf"function\s+({NAME})\s*\(([^)]*)\)", text):
        params = [p.strip() for p in m[2].split(",") if p.strip()]
        for args in calls(text, m[1]):
            for k, param in enumerate(params):
                found.setdefault(param, []).append(args[k] if k < len(args) else "nil")
    return found


def key_names(text: str) -> Callable[[str], bool]:
    """Whether an expression of ``text`` is derived from KEYS only (the greatest fixed
    point: names start derived, and lose it by any definition that is not)."""
    defs = definitions(text)
    derived = set(defs)

    def ok(expr: str) -> bool:
        expr = expr.strip()
        while expr.startswith("(") and expr.endswith(")"):
            expr = expr[1:-1].strip()
        if re.fullmatch(r"KEYS\[[^\]]*\]", expr):
            return True
        m = re.fullmatch(rf"({NAME})(?:\[[^\]]*\])?", expr)
        if m:
            return m[1] in derived
        if expr.startswith("{") and expr.endswith("}"):
            items, _ = split_args(f"({expr[1:-1]})", 0)
            return all(ok(item) for item in items)
        return False

    changed = True
    while changed:
        changed = False
        for name in list(derived):
            if not all(ok(value) for value in defs[name]):
                derived.discard(name)
                changed = True
    return ok


def undeclared_keys(source: str) -> list[str]:
    """The ``redis.call``s of ``source`` whose key argument is not derived from KEYS."""
    text = strip_comments(source)
    ok = key_names(text)
    bad = []
    for name in ("redis.call", "redis.pcall"):
        for args in calls(text, name):
            command = re.fullmatch(r"'([A-Za-z]+)'", args[0])
            assert command, f"{name}({args[0]}, ...): the command must be a literal"
            positions = KEY_ARGS.get(command[1].upper())
            assert positions is not None, f"{command[1]}: add its key positions to KEY_ARGS"
            rest = args[1:]
            for position in positions:
                for arg in rest if position == ALL else rest[position : position + 1]:
                    if not ok(arg):
                        bad.append(f"{name}({', '.join(args)})")
    return bad


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_key_a_script_touches_is_passed_in_keys(script: Path) -> None:
    source = "\n".join(p.read_text(encoding="utf-8") for p in [*PRELUDES, script])
    assert undeclared_keys(source) == []


@pytest.mark.parametrize(
    "source",
    [
        "redis.call('GET', KEYS[1] .. '#tickets')",
        "redis.call('DEL', KEYS[1], ARGV[1])",
        "local k = ARGV[1]\nredis.call('HGET', k, 'x')",
        "local k = KEYS[1]\nk = k .. ':0'\nredis.call('ZCARD', k)",
        "local function f(key) return redis.call('GET', key) end\nf(KEYS[1])\nf('other')",
        "for _, key in ipairs(ARGV) do redis.call('DEL', key) end",
        "local keys = {KEYS[1], 'x'}\nredis.call('GET', keys[2])",
        "local k = KEYS[1]\nif ARGV[1] then k = ARGV[2] end\nredis.call('GET', k)",
    ],
)
def test_keys_built_in_lua_are_found(source: str) -> None:
    assert undeclared_keys(source)


@pytest.mark.parametrize(
    "source",
    [
        "local a, b = KEYS[1], KEYS[2]\nredis.call('DEL', a, b)",
        "local function f(key) return redis.call('GET', key) end\nf(KEYS[1])\nf(KEYS[2])",
        "for i = 1, #KEYS do local key = KEYS[i]\nredis.call('PEXPIRE', key, 10) end",
        "for _, key in ipairs(KEYS) do redis.call('DEL', key) end",
        "local due, entries = unpack(KEYS)\nredis.call('ZREM', due, 'x')",
    ],
)
def test_keys_from_keys_pass(source: str) -> None:
    assert undeclared_keys(source) == []
