"""The bench: its job timeline (how long Spark jobs ran, overlapping jobs counted once) and its
warm-up runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cdc_tools.bench import merges as bench
from cdc_tools.bench.merges import Measure, _interval, _millis, _union_ms
from cdc_tools.cli import main

T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


def span(start_ms: int, end_ms: int) -> tuple[datetime, datetime]:
    return T0 + timedelta(milliseconds=start_ms), T0 + timedelta(milliseconds=end_ms)


def test_disjoint_jobs_add_up() -> None:
    assert _union_ms([span(0, 100), span(200, 250)]) == 150


def test_overlapping_and_nested_jobs_count_once() -> None:
    # 0-100 and 50-180 overlap (180 ms), 60-70 is inside both, 300-310 is apart.
    assert _union_ms([span(50, 180), span(0, 100), span(60, 70), span(300, 310)]) == 190


def test_a_job_still_running_is_left_out() -> None:
    assert _union_ms([span(0, 40), None]) == 40
    assert _union_ms([]) == 0


def test_rest_api_times() -> None:
    job = {
        "submissionTime": "2026-11-26T09:00:00.250GMT",
        "completionTime": "2026-11-26T09:00:01.000GMT",
    }
    assert _interval(job) == span(250, 1000)
    assert _millis(job) == 750
    assert _millis({"submissionTime": "2026-11-26T09:00:00.250GMT"}) == 0


def test_warm_up_runs_are_kept_apart_from_the_median(monkeypatch: pytest.MonkeyPatch) -> None:
    seconds = iter([9.0, 5.0, 3.0, 1.0, 2.0])  # two warm-up runs, then three counted
    labels: list[str] = []

    def measure(spark: object, label: str, method: str, final: Path, action: object) -> Measure:
        labels.append(label)
        return Measure(method, next(seconds), [], None, None, 0, 0)

    fresh: list[int] = []
    monkeypatch.setattr(bench, "_measure", measure)
    spec = bench.BenchSpec(repeats=3, warm_up_runs=2)
    got = bench.repeated_measure(
        None,
        spec,
        "case",
        "overwrite_final",
        Path("f"),
        action=dict,
        fresh=lambda: fresh.append(1),  # type: ignore[arg-type]
    )
    assert (got.seconds, got.runs, got.warm_up_runs) == (2.0, [3.0, 1.0, 2.0], [9.0, 5.0])
    assert labels == [f"case/{n}" for n in range(5)]
    assert len(fresh) == 4  # a fresh copy before every run but the first


def test_bench_refuses_a_negative_number_of_warm_up_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--warm-up-runs", "-1"]) == 2
    assert "--warm-up-runs must be at least 0, not -1" in capsys.readouterr().err


def test_connect_tags_are_this_process_own() -> None:
    """A Connect server keeps the jobs of every bench it served: the same case label in two
    benches must not find the other's jobs."""
    tag = bench._tag("fraction-0.01/0/overwrite_final,x")
    assert tag.startswith("fraction-0.01/0/overwrite_final_x-") and "," not in tag
    assert tag.endswith(bench._BENCH_RUN) and len(bench._BENCH_RUN) == 8
