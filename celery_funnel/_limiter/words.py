"""How messages count things: "1 task", "2 tasks" (``plural``), and the hint of an
optional part whose packages are missing (``missing_extra``)."""

from __future__ import annotations

__all__ = ["missing_extra", "plural"]


def plural(count: int, word: str, words: str = "") -> str:
    """``count`` and ``word``, made plural unless ``count`` is 1 (``words``: its plural,
    when not ``word`` + "s"): "1 task", "2 tasks"."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def missing_extra(module: str, needs: str, packages: str) -> str:
    """The message of the ImportError of ``module`` (an optional part) when ``needs``
    is not installed: the pip command, and the extra of the same name in a clone (the
    package is not on PyPI)."""
    extra = module.rsplit(".", 1)[-1]
    return (
        f"{module} needs {needs}: pip install {packages}"
        f" (in a clone of celery-funnel: pip install '.[{extra}]')"
    )
