"""``Script.load`` reads a script from the package's ``lua/``, or from a ``directory``
of its own (a limiter kind kept outside the package); either way its ``body`` is its
own text, without the prelude (what a chain of decisions wraps)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from celery_funnel._limiter.scripts import Script, source

PACKAGE_LUA = Path(__file__).resolve().parents[2] / "celery_funnel" / "lua"


def test_a_package_script_is_its_prelude_then_its_body() -> None:
    script = Script.load("fixed_window")
    assert script.body == (PACKAGE_LUA / "fixed_window.lua").read_text("utf-8")
    assert script.source == source("_clock") + script.body
    assert script.sha == hashlib.sha1(script.source.encode()).hexdigest()


def test_a_script_from_a_directory_of_its_own(tmp_path: Path) -> None:
    text = "-- mine.lua\nreturn {now_us(ARGV[1])}\n"
    (tmp_path / "mine.lua").write_text(text, "utf-8")
    script = Script.load("mine", admitted="true", directory=tmp_path)
    assert (script.name, script.body, script.admitted) == ("mine", text, "true")
    assert script.source == source("_clock") + text  # the prelude from the package
    assert Script.load("mine", prelude=(), directory=str(tmp_path)).source == text
    with pytest.raises(FileNotFoundError):
        Script.load("absent", directory=tmp_path)


def test_a_built_script_is_its_own_body() -> None:
    assert Script.build("x", "return 1").body == "return 1"
    assert Script.build("x", "a\\nb", body="b").body == "b"
