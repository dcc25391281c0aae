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


def latest_run(section: str = "tool_calls") -> tuple[str, dict[str, object]]:
    """The latest run (not a quick one) that measured ``section``: a full run, or the load section run alone."""
    runs = [
        (result["date"], path)
        for path in (REPO / "benchmarks" / "results").glob("*.json")
        if "quick" not in path.name and section in (result := json.loads(path.read_text()))
    ]
    assert runs, f"benchmarks/results holds no run of {section}"
    path = max(runs)[1]
    return f"results/{path.name}", json.loads(path.read_text())


def test_the_readme_table_is_the_rendering_of_the_latest_run(tmp_path: Path) -> None:
    source, results = latest_run()
    blocks = [(report.START, report.END, report.tables(results, source))]
    if "load" in results:
        blocks.append((report.LOAD_START, report.LOAD_END, report.load_tables(results, source)))
    for section, (start, end, render) in SECTION_BLOCKS.items():
        if section in results:
            blocks.append((start, end, render(results[section], source)))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n" + "".join(f"{start}\nold\n{end}\nbetween\n" for start, end, _ in blocks))
    report.update_readme(results, readme, source)
    assert readme.read_text() == "intro\n" + "".join(f"{a}\n{text}\n{b}\nbetween\n" for a, b, text in blocks)
    committed = (REPO / "benchmarks" / "README.md").read_text()
    block = committed.split(report.START)[1].split(report.END)[0].strip()
    assert block == report.tables(results, source), "benchmarks/README.md is not the rendering of the latest run"


def test_the_load_block_is_the_rendering_of_the_latest_load_run() -> None:
    source, results = latest_run("load")
    committed = (REPO / "benchmarks" / "README.md").read_text()
    block = committed.split(report.LOAD_START)[1].split(report.LOAD_END)[0].strip()
    assert block == report.load_tables(results, source), "the load block is not the rendering of the latest load run"


# The blocks a section's own run rewrites: (section, start marker, end marker, renderer).
SECTION_BLOCKS = {
    "workers": (report.WORKERS_START, report.WORKERS_END, report.workers_tables),
    "hypercorn": (report.HYPERCORN_START, report.HYPERCORN_END, report.hypercorn_tables),
    "cold_start": (report.COLD_START, report.COLD_END, report.cold_start_tables),
    "written": (report.WRITTEN_START, report.WRITTEN_END, report.written_tables),
    "layers": (report.LAYERS_START, report.LAYERS_END, report.layers_tables),
    "process_mode": (report.PROCESS_START, report.PROCESS_END, report.process_mode_tables),
    "request_profile": (report.PROFILE_START, report.PROFILE_END, report.request_profile_tables),
    "confined_server": (report.CONFINED_SERVER_START, report.CONFINED_SERVER_END, report.confined_server_tables),
}


@pytest.mark.parametrize("section", SECTION_BLOCKS)
def test_each_sections_block_is_the_rendering_of_its_latest_run(section: str) -> None:
    start, end, render = SECTION_BLOCKS[section]
    source, results = latest_run(section)
    committed = (REPO / "benchmarks" / "README.md").read_text()
    block = committed.split(start)[1].split(end)[0].strip()
    assert block == render(results[section], source), f"the {section} block is stale"
    assert ": met (" in block or ": missed (" in block


def test_the_targets_say_met_or_missed_with_the_numbers() -> None:
    lines = [line for line in report.targets(latest_run()[1]) if line.startswith("- ")]
    assert len(lines) >= 8
    assert all(": met (" in line or ": missed (" in line for line in lines)


def test_the_plot_is_an_svg(tmp_path: Path) -> None:
    report.write_plot(latest_run()[1], tmp_path / "plot.svg")
    svg = (tmp_path / "plot.svg").read_text()
    assert svg.startswith("<svg")
    assert "<polyline" in svg


def test_a_full_runs_figures_are_drawn_from_its_results(tmp_path: Path) -> None:
    """``plots.draw`` on a committed full run: the three figures, SVG with their text as text, each naming what it
    compares; a run without those sections draws none."""
    import xml.etree.ElementTree as ElementTree

    import plots

    results = json.loads((REPO / "benchmarks" / "results" / "2026-12-03.json").read_text())
    written = plots.draw(results, tmp_path)
    assert [path.name for path in written] == ["tool-calls.svg", "cold-batch.svg", "process-mode.svg"]
    texts = {path.name: " ".join(ElementTree.parse(path).getroot().itertext()) for path in written}
    assert "FastAPI's floor" in texts["tool-calls.svg"]
    assert "Gym's launcher" in texts["tool-calls.svg"]
    assert "constructed once" in texts["cold-batch.svg"]
    assert "target: 0.7" in texts["process-mode.svg"]
    assert plots.draw({"date": "x"}, tmp_path / "none") == []
