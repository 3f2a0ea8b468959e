"""OpenTelemetry traces across a deferral: with the Celery instrumentation in the
producer and in the worker's main process (``otel_proj``), a task parked or published
again by the worker gate still runs in the trace its producer started, and the gate's
publishes open no root span of their own."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_funnel.testing import CeleryWorkers
from tests.integration.proj import close_app, make_app, runs
from tests.integration.test_celery_state import CAPPED
from tests.integration.test_observability import ROOT
from tests.polling import wait_for

otel = pytest.importorskip("opentelemetry.instrumentation.celery")
sdk = pytest.importorskip("opentelemetry.sdk.trace")
memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
export = pytest.importorskip("opentelemetry.sdk.trace.export")

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def producer_spans() -> Iterator[Any]:
    """This process's Celery instrumentation, into an in-memory exporter."""
    exporter = memory.InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    instrumentor = otel.CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield exporter
    instrumentor.uninstrument()


def spans_in(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.mark.parametrize(
    ("env", "how"),
    [(CAPPED, "parked"), ({**CAPPED, "FUNNEL_TEST_PARK": "0"}, "republished")],
    ids=["parked", "republished"],
)
def test_one_trace_per_task_across_the_gates_publishes(
    standalone_url: str, tmp_path: Path, producer_spans: Any, env: dict[str, str], how: str
) -> None:
    app: Celery = make_app(standalone_url, standalone_url, task_ignore_result=True)
    path = tmp_path / "worker-spans.jsonl"
    base = {
        "FUNNEL_TEST_BROKER": standalone_url, "FUNNEL_TEST_REDIS": standalone_url,
        "FUNNEL_TEST_SPANS": str(path),
    }  # fmt: skip
    try:
        with CeleryWorkers(
            "tests.integration.otel_proj", 1, {**base, **env}, "-c", "2", "-Q", "proj", cwd=ROOT
        ):
            ids = [app.tasks["proj.limited"].delay(n).id for n in range(12)]
            wait_for(lambda: len(runs(standalone_url)) == 12, 30)
            wait_for(lambda: sum(s["name"].startswith("run/") for s in spans_in(path)) == 12)
    finally:
        close_app(app)
    sent = {s.attributes["messaging.message.id"]: s for s in producer_spans.get_finished_spans()}
    assert set(sent) == set(ids)
    trace_of = {i: f"{span.context.trace_id:032x}" for i, span in sent.items()}
    worker = spans_in(path)
    runs_of = {
        s["attributes"].get("messaging.message.id"): s
        for s in worker
        if s["name"].startswith("run/")
    }
    gate = [s for s in worker if s["name"].startswith("apply_async/")]
    requeues = sum(r["requeues"] for r in runs(standalone_url))
    print(f"\n{how}: {len(gate)} gate publishes traced, {requeues} re-queues")
    assert requeues >= 3, "the test is about tasks the gate published again"
    assert len(gate) >= requeues  # every publish of the gate was traced ...
    # ... as a child in the producer's trace: no root span in the worker
    assert [s for s in worker if s["parent"] is None] == []
    by_trace: dict[str, set[str]] = defaultdict(set)
    for span in gate:
        by_trace[span["trace"]].add(span["attributes"]["messaging.message.id"])
    assert all(len(tasks) == 1 for tasks in by_trace.values())
    for task_id in ids:  # each run in the trace its producer started
        assert runs_of[task_id]["trace"] == trace_of[task_id], task_id
