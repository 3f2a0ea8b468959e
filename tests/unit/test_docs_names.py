"""Docs against code (issue 43): every task option (``funnel_*``), setting, CLI command
(``celery funnel <cmd>``) and metric (``celery_funnel_*``, but for the message headers
of that prefix) that docs/*.md and README.md name exists in the code, and every one the
code has is named in the docs. The code's lists come from its own tables:
``_config.options.OPTIONS``, ``_config.settings``' defaults, the ``celery funnel`` click
group, and the metrics ``prometheus.enable`` registers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from celery_funnel import FunnelTask, prometheus
from celery_funnel._celery import waiting
from celery_funnel._cli.commands import funnel
from celery_funnel._config import options, settings
from celery_funnel._shared.state import SEND

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def docs() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in PAGES)


def named(pattern: str) -> set[str]:
    return set(re.findall(pattern, docs()))


OPTIONS = set(options.OPTIONS)
SETTINGS = set(settings._DEFAULTS)
# other funnel_* names of the code: FunnelTask's methods (funnel_settle, ...)
METHODS = {
    n for n in dir(FunnelTask) if n.startswith("funnel_") and callable(getattr(FunnelTask, n))
}
COMMANDS = set(funnel.commands)
INSPECT = {waiting.COMMAND}  # celery inspect funnel_waiting
# message headers of the code that share the metrics' prefix (not metrics)
HEADERS = {SEND}
# the misspellings the docs show as mistakes the checks catch
MISTAKES = {"funnel_capcity", "funnel_limit"}


def metric_names() -> Iterator[tuple[str, set[str]]]:
    """Each metric: its name, and every name it is exposed under (``_total`` ...)."""
    registry = CollectorRegistry()
    metrics = prometheus.enable(registry)
    try:
        for family in registry.collect():
            shown = {s.name for s in family.samples if not s.name.endswith("_created")}
            yield (
                family.name,
                {
                    family.name,
                    *shown,
                    f"{family.name}_total" if family.type == "counter" else family.name,
                },
            )
    finally:
        metrics.disconnect()


METRICS = dict(metric_names())


def test_the_code_lists_are_read() -> None:
    assert {"funnel_rate", "funnel_concurrency", "funnel_max_waiting"} <= OPTIONS
    assert {"funnel_redis_url", "funnel_key_prefix", "funnel_limits"} <= SETTINGS
    assert {"status", "inspect", "why", "dashboard"} <= COMMANDS
    assert {"celery_funnel_admitted", "celery_funnel_backend_up"} <= set(METRICS)


def test_every_funnel_name_in_the_docs_is_an_option_setting_or_method() -> None:
    assert not MISTAKES & (OPTIONS | SETTINGS | METHODS)
    known = OPTIONS | SETTINGS | METHODS | INSPECT | MISTAKES
    unknown = sorted(n for n in named(r"\bfunnel_[a-z0-9_]*[a-z0-9]\b") if n not in known)
    assert unknown == [], f"the docs name what the code does not have: {unknown}"


@pytest.mark.parametrize("name", sorted(OPTIONS | SETTINGS))
def test_every_option_and_setting_is_in_the_docs(name: str) -> None:
    # the reference is generated: the hand-written pages must name it too
    pages = "\n".join(p.read_text(encoding="utf-8") for p in PAGES if p.name != "reference.md")
    assert re.search(rf"\b{name}\b", pages), f"{name} is named only in the reference, if at all"


def test_every_cli_command_in_the_docs_exists_and_the_reverse() -> None:
    said = named(r"\bcelery (?:-A \S+ )?funnel ([a-z][a-z-]*)")
    assert sorted(said - COMMANDS) == [], "commands the docs name that the CLI lacks"
    assert sorted(COMMANDS - said) == [], "commands of the CLI the docs never name"


def test_every_metric_in_the_docs_exists_and_the_reverse() -> None:
    exposed = {shown for names in METRICS.values() for shown in names}
    said = named(r"\bcelery_funnel_[a-z_]*[a-z]\b")
    assert sorted(said - exposed - HEADERS) == [], "metrics the docs name that the code lacks"
    missing = sorted(name for name, shown in METRICS.items() if not shown & said)
    assert missing == [], "metrics of the code the docs never name"
