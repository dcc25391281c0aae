"""The benchmark report renders from a recorded run (no timing here: speed is measured by `make bench`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.unit

sys.path.insert(0, str(REPO / "benchmarks"))
import report  # noqa: E402


def latest_run() -> tuple[str, dict[str, object]]:
    runs = sorted(p for p in (REPO / "benchmarks" / "results").glob("*.json") if "quick" not in p.name)
    assert runs, "benchmarks/results holds no full run"
    result: dict[str, object] = json.loads(runs[-1].read_text())
    return f"results/{runs[-1].name}", result


def test_the_readme_table_is_the_rendering_of_the_latest_run(tmp_path: Path) -> None:
    source, results = latest_run()
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.START}\nold\n{report.END}\noutro\n")
    report.update_readme(results, readme, source)
    assert readme.read_text() == f"intro\n{report.START}\n{report.tables(results, source)}\n{report.END}\noutro\n"
    committed = (REPO / "benchmarks" / "README.md").read_text()
    block = committed.split(report.START)[1].split(report.END)[0].strip()
    assert block == report.tables(results, source), "benchmarks/README.md is not the rendering of the latest run"


def test_the_targets_say_met_or_missed_with_the_numbers() -> None:
    lines = [line for line in report.targets(latest_run()[1]) if line.startswith("- ")]
    assert len(lines) >= 8
    assert all(": met (" in line or ": missed (" in line for line in lines)


def test_the_plot_is_an_svg(tmp_path: Path) -> None:
    report.write_plot(latest_run()[1], tmp_path / "plot.svg")
    svg = (tmp_path / "plot.svg").read_text()
    assert svg.startswith("<svg")
    assert "<polyline" in svg
