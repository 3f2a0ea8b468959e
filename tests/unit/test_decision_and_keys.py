from __future__ import annotations

import pickle

import pytest
from redis.crc import key_slot

from celery_funnel import ConfigurationError, Decision, Funnel, MemoryFunnel, Reservation
from celery_funnel._limiter.keys import (
    PARKED_PARTS,
    ParkedKeys,
    companion_key,
    glob_escape,
    hash_tag,
    limit_key,
    parked_keys,
    parse_key,
    scan_pattern,
    task_key,
    tickets_key,
)
from celery_funnel._limiter.scripts import Arg, Reply, Script


@pytest.mark.parametrize(
    ("retry_after", "reset_after", "cell"),
    [
        (-1.0, 0.0, (-1, 0)),
        (1.0, 2.0, (1, 2)),
        (0.001, 1.999, (1, 2)),  # a partial second of >= 1 ms counts as a second
        (0.0009, 2.0005, (0, 2)),  # less than 1 ms does not (as redis-cell)
        (2.5, 3.25, (3, 4)),
    ],
)
def test_as_cell_rounds_partial_seconds_up(
    retry_after: float, reset_after: float, cell: tuple[int, int]
) -> None:
    decision = Decision(True, 5, 0, retry_after, reset_after)
    assert decision.as_cell() == (1, 5, 0, *cell)


def test_answers_pickle() -> None:
    for answer in (Decision(False, 3, 2, -1.0, 0.5, 1), Reservation(False, 0.2, True, 1, 0.3)):
        assert pickle.loads(pickle.dumps(answer)) == answer


@pytest.mark.parametrize("key", ["plain", "user:42", "a{b", "{tag}rest", "x{tag}y{other}", "日本"])
def test_companion_keys_share_the_cluster_slot(key: str) -> None:
    assert key_slot(companion_key(key, "tickets").encode()) == key_slot(key.encode())


def test_no_companion_can_share_the_slot_of_a_key_with_a_stray_brace() -> None:
    """Redis hashes "a{}b" whole, and no key holding it whole as a tag exists; the key
    builder of the Celery layer never makes such keys."""
    assert companion_key("a{}b", "tickets") == "a{}b#tickets"


@pytest.mark.parametrize(
    ("key", "layout"),
    [
        (task_key("funnel:", "proj.send"), "funnel:{proj.send}"),
        (task_key("funnel:", "proj.send", "cust42"), "funnel:{proj.send:cust42}"),
        (task_key("funnel:", "proj.send", "cust42", 1), "funnel:{proj.send}:1:cust42"),
        (task_key("funnel:", "proj.send", "", 0), "funnel:{proj.send}:0"),
        (task_key("p:", "a task{x}"), "p:{~6533744eaae5e1cf00e19e60}"),
        (limit_key("funnel:", "emails.*"), "funnel:{limit:emails.*}"),
        (limit_key("funnel:", "*", "w1@host"), "funnel:{limit:*:w1@host}"),
        (tickets_key("funnel:{proj.send}"), "funnel:{proj.send}#tickets"),
    ],
)
def test_every_key_is_prefix_then_hash_tag(key: str, layout: str) -> None:
    """<prefix>{<funnel name>}<suffix>: companions under the prefix, in the funnel's slot."""
    assert key == layout
    parsed = parse_key(key.split("{", maxsplit=1)[0], key)
    assert parsed is not None
    assert key_slot(tickets_key(parsed.funnel).encode()) == key_slot(key.encode())


def test_keys_of_one_funnel_are_told_apart_from_foreign_keys() -> None:
    prefix = "funnel:"
    funnel = task_key(prefix, "proj.send", "c1")
    parsed = parse_key(prefix, tickets_key(funnel))
    assert parsed is not None
    assert (parsed.name, parsed.companion, parsed.funnel) == ("proj.send:c1", "tickets", funnel)
    assert parsed.of_task("proj.send")
    assert not parsed.of_task("proj.sen")
    several = parse_key(prefix, task_key(prefix, "proj.send", "c1", 1))
    assert several is not None
    assert several.of_task("proj.send", 1)
    assert not several.of_task("proj.send", 0)
    assert not several.of_task("proj.send")
    worker = parse_key(prefix, limit_key(prefix, "emails.*", "w1"))
    assert worker is not None
    assert worker.of_limit("emails.*")
    assert not worker.of_limit("*")
    foreign_keys: list[str | bytes] = [
        "celery", "_kombu.binding.celery", "celery-task-meta-1", "funnel:proj.send",
        "funnel:{a b}", "funnel:{x}#other", "funnel:{x}}", "other:{x}", b"funnel:{\xff}",
        "funnel:{proj.send}:1:x y", "{proj.send}", "{x}:tickets", "funnel:{x}:tickets:0",
    ]  # fmt: skip
    for foreign in foreign_keys:
        assert parse_key(prefix, foreign) is None, foreign


def test_glob_characters_of_the_prefix_are_escaped() -> None:
    assert glob_escape("a*b?c[d]e\\f") == "a\\*b\\?c\\[d\\]e\\\\f"
    assert scan_pattern("*") == "\\*{*"
    assert scan_pattern("app[1]:", "celery") == "app\\[1\\]:{celery*"


def test_hash_tag() -> None:
    assert hash_tag("a{b}c") == "b"
    assert hash_tag("a{}c") is None
    assert hash_tag("abc") is None


class _Unreachable(Funnel):
    """A store that must never be reached."""

    def _eval(self, script: Script, keys: object, args: list[Arg]) -> Reply:  # type: ignore[override]
        raise AssertionError(f"{script.name} reached the store")

    def reset(self, key: str) -> None:
        raise AssertionError("reset reached the store")


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda f: f.throttle("k", 0, 0, 1), "count"),
        (lambda f: f.throttle("k", 0, 1, 0), "period"),
        (lambda f: f.throttle("k", -1, 1, 1), "max_burst"),
        (lambda f: f.throttle("k", 0, 1, 1, -1), "quantity"),
        (lambda f: f.throttle("", 0, 1, 1), "key"),
        (lambda f: f.throttle("k", 0, [1], 1), "count"),
        (lambda f: f.throttle("k", 0, 1, 1, now=float("nan")), "now"),
        (lambda f: f.throttle("k", 10**12, 1, 3600), "too large"),
        (lambda f: f.reserve("k", 0, 1, 1, 0), "quantity"),
        (lambda f: f.reserve("k", 0, 1, 1, redeem=True), "ticket"),
        (lambda f: f.reserve("k", 0, 1, 1, ticket="t", late=-1), "late"),
        (lambda f: f.fixed_window("k", 0, 1), "count"),
        (lambda f: f.sliding_log("k", 1, -5), "period"),
        (lambda f: f.sliding_window("k", 1, 1, windows=0), "windows"),
        (lambda f: f.sliding_window("k", 1, 1, windows=101), "windows"),
    ],
)
def test_bad_arguments_fail_before_the_store(call: object, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        call(_Unreachable())  # type: ignore[operator]


def test_memory_funnel_forgets_idle_funnels() -> None:
    now = [1000.0]
    funnel = MemoryFunnel(clock=lambda: now[0])
    funnel.throttle("k", 1, 10, 1)
    funnel.throttle("k", 1, 10, 1)
    assert funnel.store.keys() == ["k"]
    now[0] += 0.2  # both units leaked out: the funnel is idle
    assert funnel.store.keys() == []


def test_memory_funnel_reset() -> None:
    funnel = MemoryFunnel()
    funnel.throttle("k", 0, 1, 3600)
    funnel.reserve("k", 0, 1, 3600, ticket="t")
    funnel.sliding_window("w", 1, 60, windows=3)  # one hash, whatever the windows
    assert sorted(funnel.store.keys()) == ["k", "w", "{k}#tickets"]
    funnel.reset("k")
    funnel.reset("w")
    assert funnel.store.keys() == []


def test_the_parked_keys_are_named_in_their_order() -> None:
    keys = parked_keys("p:")
    assert [name.replace("_", "-") for name in ParkedKeys._fields] == list(PARKED_PARTS)
    assert keys.counts == keys[7] == "p:{~parked}#counts"
    assert keys.due == keys[0]
    assert keys.accepted_at.endswith("#accepted-at")
