"""Concurrency variants, without a server: a ``funnel_limits`` entry names one with
``"variant"`` (the built-in ``"seats"`` when it names none), the gate's one entry
(``_gate.concurrency.Concurrency``) gives a run's seats the variant they name, and one
it does not know fails the task, named. The variant followed through a real worker is
``tests/integration/test_toy_variant.py``'s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_funnel import ConfigurationError, install
from celery_funnel._config.runtime import runtime_for
from celery_funnel._config.settings import FunnelSettings
from celery_funnel._gate import concurrency
from celery_funnel._gate.concurrency import Concurrency, Variant, register, variant_named
from celery_funnel._limiter.concurrency import SEATS, ConcurrencyLimit
from celery_funnel._stores.concurrency import ConcurrencyFunnel


def settings(limits: Any) -> FunnelSettings:
    return FunnelSettings.from_conf({"funnel_redis_url": "redis://x", "funnel_limits": limits})


class Other(Variant):
    name = "other"


@pytest.fixture
def other() -> Iterator[Variant]:
    """``other`` registered for the test only."""
    variant = Other()
    register(variant)
    try:
        yield variant
    finally:
        del concurrency._VARIANTS[variant.name]


def test_an_entry_names_its_variant() -> None:
    read = settings({
        "a.*": {"concurrency": 2},
        "b.*": {"concurrency": 1, "variant": "other", "scope": "worker"},
        "c.*": {"rate": "5/s", "concurrency": 3, "variant": "other"},
    })  # fmt: skip
    assert read.concurrency == (
        ConcurrencyLimit(2, "a.*", "global", SEATS),
        ConcurrencyLimit(1, "b.*", "worker", "other"),
        ConcurrencyLimit(3, "c.*", "global", "other"),
    )
    assert [limit.pattern for limit in read.limits] == ["c.*"], "the rate's own keys"


@pytest.mark.parametrize("value", ["", 3, None])
def test_a_bad_variant_is_named(value: Any) -> None:
    with pytest.raises(ConfigurationError) as raised:
        settings({"a.*": {"concurrency": 2, "variant": value}})
    assert f"funnel_limits['a.*']: 'variant' must be a variant's name, got {value!r}" in str(
        raised.value
    )


def test_a_variant_is_not_part_of_what_a_funnel_is() -> None:
    """A seat promised under one variant is the same seat under another: the gate gives
    up only those it does not need."""
    assert ConcurrencyFunnel(1, "k", "l", "other") == ConcurrencyFunnel(1, "k", "l")
    assert ConcurrencyFunnel(1, "k", "l").variant == SEATS


def _entry(limits: dict[str, Any]) -> Concurrency:
    app = Celery("variants", set_as_current=False)
    app.conf.funnel_redis_url = "redis://127.0.0.1:1/0"  # never reached
    app.conf.funnel_limits = limits
    install(app)

    def no_renewal(app: Any, node: str) -> Any:
        raise AssertionError("no seat is taken here")

    fake: Any = None
    return Concurrency(
        runtime_for(app), app, "w1@host", "w1@host", no_renewal, parking=fake, waits=fake,
        admit=fake, fail=fake,
    )  # fmt: skip


def test_the_gate_gives_a_runs_seats_their_variant(other: Variant) -> None:
    entry = _entry({"a.*": {"concurrency": 2}, "a.b": {"concurrency": 1, "variant": "other"}})
    seats = entry.of("a.b", "a.b", (), {})
    assert [(s.label, s.variant) for s in seats] == [("limit:a.*", SEATS), ("limit:a.b", "other")]
    assert entry.variant(seats) is other, "the first one not the built-in"
    assert entry.variant(seats[:1]) is variant_named(SEATS)
    assert type(variant_named(SEATS)) is Variant


def test_a_variant_no_one_registered_fails_its_task_named() -> None:
    entry = _entry({"a.*": {"concurrency": 2, "variant": "nowhere"}})
    with pytest.raises(ConfigurationError) as raised:
        entry.of("a.b", "a.b", (), {})
    assert "funnel_limits['a.*']: no concurrency variant 'nowhere'" in str(raised.value)
    assert "the variants are ['seats']" in str(raised.value)
