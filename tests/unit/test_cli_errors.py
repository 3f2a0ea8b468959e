"""Command-line errors are one line: the ``funnel`` group's, and ``celery-funnel``'s."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from celery_funnel import ConfigurationError
from celery_funnel._cli.errors import DEBUG_ENV, OneLineErrors
from celery_funnel._cli.main import main


@click.group(cls=OneLineErrors)
def group() -> None:
    """A group like ``celery funnel``."""


@group.command()
@click.argument("what")
def fail(what: str) -> None:
    """Raise what is asked for."""
    if what == "config":
        raise ConfigurationError("funnel_rate: invalid rate 'x': expected 'N/s'")
    if what == "click":
        raise click.ClickException("no funnel 'x'")
    if what == "exit":
        raise click.exceptions.Exit(3)
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("what", "code", "said"),
    [
        ("config", 1, "Error: funnel_rate: invalid rate 'x': expected 'N/s'\n"),
        ("click", 1, "Error: no funnel 'x'\n"),
        ("exit", 3, ""),
        ("bug", 1, f"Error: RuntimeError: boom (set {DEBUG_ENV}=1 for the traceback)\n"),
    ],
)
def test_every_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch, what: str, code: int, said: str
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    done = CliRunner().invoke(group, ["fail", what])
    assert (done.exit_code, done.stderr) == (code, said)
    assert done.stdout == ""


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_debug_lets_the_error_through(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(DEBUG_ENV, value)
    done = CliRunner().invoke(group, ["fail", "config"])
    assert isinstance(done.exception, ConfigurationError)  # with its traceback


def test_celery_funnel_demo_with_a_bad_rate_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    with pytest.raises(SystemExit) as info:
        main(["demo", "--rate", "fast"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "celery-funnel: error: invalid rate 'fast': expected 'N' (per second), 'N/s', 'N/m',"
        " 'N/h', 'N/d' or 'N/<seconds>s', N like 5 or 0.5"
    ]
