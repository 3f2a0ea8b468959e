"""Which ends of runs are recorded before a late ack (``_celery.late_ack``): a run the
worker gate admitted, of a task that acks late, that ended (success, failure, retry);
not one that asked to be given again (``Reject``), was deferred (``Ignore``), ran
eagerly or was not the gate's. The record itself, on real workers and brokers, is
tests/integration/test_late_ack.py; here the funnels' Redis refuses (a closed port),
so that an attempt shows as the warning that it failed, and the run goes on."""

from __future__ import annotations

import logging

import pytest
from celery import Celery, states

from celery_funnel import install
from celery_funnel._celery.late_ack import _on_postrun, acks_late
from celery_funnel._config.runtime import runtime_for
from celery_funnel._gate.state import HEADER, gate_mark
from celery_funnel.testing import free_port


def _recorded(
    caplog: pytest.LogCaptureFixture, state: str, *, late: bool = True, mark: bool = True,
    eager: bool = False,
) -> bool:  # fmt: skip
    """Whether a run that ended in ``state`` tried to record its end."""
    app = install(Celery("late_ack", broker="memory://", set_as_current=False))
    app.conf.funnel_redis_url = f"redis://127.0.0.1:{free_port()}/0"

    @app.task(shared=False, name="late_ack.t", bind=True, acks_late=late)
    def t(self: object) -> None: ...

    headers = {HEADER: {"gate": gate_mark()}} if mark else {}
    t.push_request(id="run-1", headers=headers, called_directly=False, is_eager=eager)
    try:
        with caplog.at_level(logging.INFO, logger="celery_funnel"):
            _on_postrun(sender=t, task_id="run-1", task=t, state=state)
    finally:
        t.pop_request()
        runtime_for(app).outage.answered()  # ends the probe a failure started
        runtime_for(app).close()
        app.close()
    return "its end was not recorded before its late ack" in caplog.text


@pytest.mark.parametrize("state", [states.SUCCESS, states.FAILURE, states.RETRY])
def test_a_run_that_ended_is_recorded(caplog: pytest.LogCaptureFixture, state: str) -> None:
    assert _recorded(caplog, state)


@pytest.mark.parametrize("state", [states.REJECTED, states.IGNORED])
def test_a_run_given_again_or_deferred_is_not(caplog: pytest.LogCaptureFixture, state: str) -> None:
    assert not _recorded(caplog, state)


def test_nor_one_acked_early_eager_or_not_the_gates(caplog: pytest.LogCaptureFixture) -> None:
    assert not _recorded(caplog, states.SUCCESS, late=False)
    assert not _recorded(caplog, states.SUCCESS, eager=True)
    assert not _recorded(caplog, states.SUCCESS, mark=False)


def _noop() -> None: ...


def test_an_app_acks_late_by_a_task_or_by_its_setting() -> None:
    app = Celery("late_ack_apps", broker="memory://", set_as_current=False)
    app.task(shared=False, name="late_ack.early")(_noop)
    assert not acks_late(app)
    app.task(shared=False, name="late_ack.late", acks_late=True)(_noop)
    assert acks_late(app)
    every = Celery("late_ack_conf", broker="memory://", set_as_current=False)
    every.conf.task_acks_late = True
    every.task(shared=False, name="late_ack.any")(_noop)
    assert acks_late(every)
