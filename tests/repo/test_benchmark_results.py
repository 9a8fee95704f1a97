"""Benchmark results are data in one folder: named by their date, indexed, apart from the pages."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cdc_tools.bench import results_index

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / results_index.RESULTS


def test_results_index_is_generated_from_the_current_result_files() -> None:
    committed = (ROOT / results_index.INDEX).read_text()
    assert committed == results_index.render(RESULTS), (
        "benchmarks/results/README.md is stale: run `python -m cdc_tools.bench.results_index --write`"
    )


def test_every_result_is_named_by_the_date_it_records() -> None:
    misnamed = []
    for path in sorted(RESULTS.glob("*.json")):
        recorded = results_index.recorded_date(json.loads(path.read_text()))
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9]+(-[a-z0-9]+)*\.json", path.name):
            misnamed.append(f"{path.name}: not <date>-<kind>[-<what>].json")
        elif recorded is not None and not path.name.startswith(recorded):
            misnamed.append(f"{path.name}: the JSON records {recorded}")
    assert misnamed == []


def test_every_plot_is_beside_its_result() -> None:
    plots = {path.stem for path in RESULTS.glob("*.png")}
    results = {path.stem for path in RESULTS.glob("*.json")}
    assert sorted(plots - results) == []


def test_docs_holds_only_pages() -> None:
    files = [path.name for path in (ROOT / "docs").iterdir() if path.is_file()]
    assert [name for name in files if not name.endswith(".md")] == []


def test_every_link_of_the_index_points_at_an_existing_file() -> None:
    index = ROOT / results_index.INDEX
    targets = re.findall(r"\]\(([^)#\s]+)", index.read_text())
    assert [target for target in targets if not (index.parent / target).exists()] == []
