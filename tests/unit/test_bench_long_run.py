"""The long-run benchmark's summary: means of every ten runs, and its line in the results index."""

from __future__ import annotations

from cdc_tools.bench import results_index
from cdc_tools.bench.long_run import blocks


def _run(n: int, wall: float) -> dict[str, object]:
    step = {"wall": wall, "client_cpu": wall / 10, "server_cpu": wall * 2}
    return {"run": n, "stage": step, "overwrite_final": {**step, "wall": wall + 1}}


def test_blocks_are_the_means_of_every_ten_runs() -> None:
    summary = blocks([_run(n, float(n)) for n in range(1, 13)])
    assert [b["runs"] for b in summary] == ["1-10", "11-12"]
    assert summary[0]["stage_wall"] == 5.5
    assert summary[0]["overwrite_final_wall"] == 6.5
    assert summary[1]["stage_client_cpu"] == 1.15
    assert summary[1]["overwrite_final_server_cpu"] == 23.0


def test_the_results_index_shows_the_first_and_last_block() -> None:
    result = {
        "benchmark": "cdc_tools.bench.long_run",
        "started_at": "2026-11-30T16:20:00+00:00",
        "runs": 12,
        "changes": 300,
        "blocks": blocks([_run(n, float(n)) for n in range(1, 13)]),
    }
    assert results_index.kind(result) == "long-run"
    assert results_index.recorded_date(result) == "2026-11-30"
    assert results_index.long_run_figures(result) == (
        "1 table x 300 changes, 12 runs one after another; runs 1-10: stage 5.50 s "
        "(client 0.550 CPU-s), overwrite_final 6.50 s (client 0.550 CPU-s); runs 11-12: stage "
        "11.50 s (client 1.150 CPU-s), overwrite_final 12.50 s (client 1.150 CPU-s)"
    )


def test_a_year_in_names_the_seeded_versions_and_the_no_op_check() -> None:
    runs = [
        {**_run(n, 1.0), "has_work": {"wall": 0.1, "client_cpu": 0.05, "server_cpu": 0}}
        for n in (1, 2)
    ]
    result = {
        "benchmark": "cdc_tools.bench.long_run",
        "runs": 2,
        "changes": 300,
        "ledger_rows": 35040,
        "blocks": blocks(runs),
    }
    assert results_index.long_run_figures(result) == (
        "1 table x 300 changes, 2 runs one after another after 35,040 ledger versions; "
        "runs 1-2: stage 1.00 s (client 0.100 CPU-s), overwrite_final 2.00 s "
        "(client 0.100 CPU-s), no-op check client 0.050 CPU-s; runs 1-2: stage 1.00 s "
        "(client 0.100 CPU-s), overwrite_final 2.00 s (client 0.100 CPU-s), no-op check "
        "client 0.050 CPU-s"
    )
