"""mkdocs hooks: BENCHMARKS.md's plots (bench/plots/*.png, kept beside the benchmarks
that draw them) join the site at the same relative path, so that the benchmarks page,
included from BENCHMARKS.md, shows them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


def on_files(files: Files, config: Any) -> Files:
    for plot in sorted((ROOT / "bench" / "plots").glob("*.png")):
        path = plot.relative_to(ROOT).as_posix()
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
