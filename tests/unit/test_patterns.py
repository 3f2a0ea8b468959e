"""The task-name patterns of ``funnel_limits``: which task names an entry's pattern
matches (``_charges.matching``: a case-sensitive glob, as ``fnmatch.fnmatchcase``), and
the patterns refused when the settings are read (non-empty strings only)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_funnel import ConfigurationError, install
from celery_funnel._celery.checks import check_app
from celery_funnel._config.settings import FunnelSettings
from celery_funnel._limiter.concurrency import ConcurrencyLimit
from celery_funnel._shared.charges import matching


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        # exact names
        ("emails.send", "emails.send", True),
        ("emails.send", "emails.sendall", False),
        ("emails.send", "my.emails.send", False),
        ("emails.send", "Emails.send", False),  # case-sensitive, on every platform
        # *: any run of characters, dots included, or none
        ("*", "emails.send", True),
        ("*", "a", True),
        ("emails.*", "emails.send", True),
        ("emails.*", "emails.", True),
        ("emails.*", "emails.bulk.send", True),
        ("emails.*", "emails", False),
        ("emails.*", "sms.send", False),
        ("emails.*", "old.emails.send", False),
        ("*.send", "sms.send", True),
        ("*.send", "sms.send.later", False),
        ("emails.*.urgent", "emails.a.b.urgent", True),
        ("emails.*.urgent", "emails.urgent", False),
        # ?: exactly one character
        ("emails.?", "emails.a", True),
        ("emails.?", "emails.ab", False),
        ("emails.?", "emails.", False),
        ("v?.send", "v2.send", True),
        # character classes, and their negation
        ("emails.[ab]*", "emails.alpha", True),
        ("emails.[ab]*", "emails.beta", True),
        ("emails.[ab]*", "emails.gamma", False),
        ("emails.[!ab]*", "emails.gamma", True),
        ("emails.[!ab]*", "emails.alpha", False),
        ("shard[0-3].run", "shard2.run", True),
        ("shard[0-3].run", "shard7.run", False),
        ("[*]", "*", True),  # a class holds a metacharacter literally
        ("[*]", "x", False),
        # what a regular expression would read otherwise: literal here
        ("a.b", "axb", False),
        ("a+b", "a+b", True),
        ("a+b", "aab", False),
        ("(x)|y", "(x)|y", True),
        ("(x)|y", "y", False),
    ],
)
def test_a_pattern_matches_task_names_as_a_glob(pattern: str, name: str, matches: bool) -> None:
    entry = ConcurrencyLimit(1, pattern)
    assert matching([entry], name) == ((entry,) if matches else ())


def test_every_matching_entry_in_order() -> None:
    entries = [
        ConcurrencyLimit(1, p) for p in ("*", "sms.*", "emails.*", "emails.send", "emails.?")
    ]
    assert [e.pattern for e in matching(entries, "emails.send")] == ["*", "emails.*", "emails.send"]
    assert [e.pattern for e in matching(entries, "sms.x")] == ["*", "sms.*"]
    assert matching([ConcurrencyLimit(1, None)], "emails.send") == (), "a task's own: no pattern"


def test_funnel_limits_read_from_settings_match_as_globs() -> None:
    settings = FunnelSettings.from_conf({
        "funnel_redis_url": "redis://x",
        "funnel_limits": {"emails.*": "5/s", "emails.send": "1/s", "sms.?": {"concurrency": 2}},
    })  # fmt: skip
    assert [lim.pattern for lim in matching(settings.limits, "emails.send")] == [
        "emails.*", "emails.send",
    ]  # fmt: skip
    assert [lim.pattern for lim in matching(settings.limits, "emails.bulk")] == ["emails.*"]
    assert [c.pattern for c in matching(settings.concurrency, "sms.a")] == ["sms.?"]
    assert matching(settings.concurrency, "sms.ab") == ()


BAD_PATTERNS = [
    (b"x", "funnel_limits: pattern b'x' is not a string (bytes)"),
    (5, "funnel_limits: pattern 5 is not a string (int)"),
    (None, "funnel_limits: pattern None is not a string (NoneType)"),
    ("", "funnel_limits: pattern '' is empty"),
]


def read(limits: Any, name: str = "funnel_limits") -> FunnelSettings:
    return FunnelSettings.from_conf({"funnel_redis_url": "redis://x", name: limits})


@pytest.mark.parametrize(("pattern", "message"), BAD_PATTERNS)
@pytest.mark.parametrize(
    "spec",
    ["5/s", {"rate": "5/s", "capacity": 2}, {"concurrency": 2}],
    ids=["rate", "dict", "slots"],
)
def test_a_pattern_that_is_no_non_empty_string_is_refused(
    pattern: object, message: str, spec: Any
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        read({"emails.*": "1/s", pattern: spec})
    text = str(raised.value)
    assert text.startswith(message)
    assert "\n" not in text, "one line"
    assert "patterns are non-empty strings" in text


@pytest.mark.parametrize("name", ["FUNNEL_LIMITS", "CELERY_FUNNEL_LIMITS"])
def test_bad_patterns_are_refused_in_every_spelling_of_the_setting(name: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^funnel_limits: pattern b'x' is not a string"):
        read({b"x": "5/s"}, name)


class Name(str):
    """A str subclass, as some config loaders give."""


def test_strings_of_any_kind_are_patterns() -> None:
    settings = read({"emails.send": "5/s", Name("sms.*"): {"concurrency": 1}, " ": "1/s"})
    assert [lim.pattern for lim in settings.limits] == ["emails.send", " "]
    assert [c.pattern for c in settings.concurrency] == ["sms.*"]


@pytest.mark.parametrize(("pattern", "message"), BAD_PATTERNS)
def test_the_worker_start_check_names_a_bad_pattern(pattern: object, message: str) -> None:
    app = install(Celery("patterns", broker="memory://", set_as_current=False))
    app.conf.update(funnel_redis_url="redis://localhost:1", funnel_limits={pattern: "5/s"})
    with pytest.raises(ConfigurationError) as raised:
        check_app(app)
    assert str(raised.value).startswith(message)
