"""``tests.integration.proj``'s app, with OpenTelemetry's Celery instrumentation in the
worker's main process (as ``opentelemetry-instrument celery worker`` does): every span
it ends is appended, one JSON line each, to the file named by FUNNEL_TEST_SPANS (the
pool processes, forked from the main one, write there too)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.integration.proj import app  # noqa: F401 - the app `celery -A` finds here


def span_record(span: ReadableSpan) -> dict[str, object]:
    """What the tests read of a span: ids (hex), parent, name, kind, attributes."""
    context, parent = span.get_span_context(), span.parent
    return {
        "trace": f"{context.trace_id:032x}" if context else "",
        "span": f"{context.span_id:016x}" if context else "",
        "parent": f"{parent.span_id:016x}" if parent else None,
        "name": span.name,
        "kind": span.kind.name,
        "attributes": {k: str(v) for k, v in (span.attributes or {}).items()},
        "pid": os.getpid(),
    }


class FileExporter(SpanExporter):
    """Appends each span to ``path``, one JSON line (whole lines: O_APPEND)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span)) + "\n" for span in spans)
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["FUNNEL_TEST_SPANS"])))
CeleryInstrumentor().instrument(tracer_provider=provider)
