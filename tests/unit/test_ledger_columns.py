"""The ledger kept as Arrow columns gives what the row-by-row reading gave (kept here as the
reference model): the latest row per file version, pending versions, freshness and health
figures, on random ledgers with ties, nulls, touches, refusals and rows of older ledgers."""

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from cdc_pipeline.paths import TablePaths
from spark_jobs.landing import LEDGER_SCHEMA, LedgerEntry, read_ledger
from spark_jobs.overwrite.applied import APPLIED_SCHEMA, pending_files
from spark_jobs.status.table_health import last_quarantine_fraction

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
START = datetime(2026, 1, 1, tzinfo=UTC)


def reference_ledger(rows: list[dict[str, Any]]) -> dict[tuple[str, str], LedgerEntry]:
    """The row-by-row reading the columns replaced (as it was at a55d9d6)."""
    latest: dict[tuple[str, str], LedgerEntry] = {}
    for row in rows:
        entry = LedgerEntry(
            row["batch"],
            row["file"],
            row.get("size"),
            row.get("mtime_ns"),
            row.get("sha256"),
            row.get("refused"),
            row.get("staged_at"),
            int(row.get("rows_staged") or 0),
            row.get("newest_change"),
        )
        key = (entry.batch, entry.file)
        known = latest.get(key)
        staged = max(entry.rows_staged, known.rows_staged if known else 0)
        newest = max(
            (t for t in (entry.newest_change, known.newest_change if known else None) if t),
            default=None,
        )
        if known is None or (entry.staged_at or EPOCH) >= (known.staged_at or EPOCH):
            latest[key] = replace(entry, rows_staged=staged, newest_change=newest)
        else:
            latest[key] = replace(known, rows_staged=staged, newest_change=newest)
    return latest


def random_rows(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Ledger rows of a few hours' file versions, several rows per version (touches, re-runs),
    staged_at often tied or null."""
    rows = []
    for index in range(count):
        batch = f"20260101{rng.randrange(4):02d}"
        name = f"c{rng.randrange(3)}.csv"
        file = name if rng.random() < 0.6 else f"{name}#v{rng.randrange(1, 3)}"
        stamp = START + timedelta(seconds=rng.randrange(5))
        rows.append(
            {
                "batch": batch,
                "file": file,
                "rows_staged": rng.choice([None, 0, 0, 3, 7]),
                "rows_quarantined": rng.choice([None, 0, 1]),
                "staged_at": None if rng.random() < 0.15 else stamp,
                "run_id": f"r{rng.randrange(6)}" if rng.random() < 0.9 else None,
                "size": rng.choice([None, 10, 20]),
                "mtime_ns": rng.choice([None, 1, 2]),
                "sha256": rng.choice([None, "aa", "bb"]),
                "refused": None if rng.random() < 0.8 else rng.choice(["bad", "link"]),
                "newest_change": None if rng.random() < 0.3 else stamp - timedelta(minutes=index),
            }
        )
    return rows


@pytest.mark.parametrize("seed", range(60))
def test_latest_rows_equal_the_row_by_row_reading(seed: int) -> None:
    rng = random.Random(seed)
    rows = random_rows(rng, rng.randrange(1, 40))
    ledger = read_ledger(pa.Table.from_pylist(rows, LEDGER_SCHEMA))
    expected = reference_ledger(rows)
    assert ledger.entries() == expected
    assert len(ledger) == len(expected)
    assert ledger.idents() == set(expected)
    hours = {"2026010101", "2026010103"}
    assert ledger.entries(hours) == {k: e for k, e in expected.items() if k[0] in hours}
    assert ledger.unrefused_batches() == {e.batch for e in expected.values() if not e.refused}
    seen: dict[str, int] = {}
    for entry in expected.values():
        if entry.staged_at is not None:
            stamp = (entry.staged_at - EPOCH) // timedelta(microseconds=1) * 1000
            seen[entry.batch] = max(seen.get(entry.batch, 0), stamp)
    assert ledger.newest_staged_ns() == seen


def test_rows_of_an_older_ledger_read_as_unknown_content() -> None:
    old = pa.table(
        {
            "batch": ["2026010100", "2026010100"],
            "file": ["a.csv", "a.csv"],
            "rows_staged": [4, 0],
            "rows_quarantined": [0, 0],
            "staged_at": pa.array([START, START + timedelta(hours=1)], pa.timestamp("us", "UTC")),
            "run_id": ["r1", "r2"],
        }
    )
    (entry,) = read_ledger(old).entries().values()
    assert entry == LedgerEntry(
        "2026010100", "a.csv", None, None, None, None, START + timedelta(hours=1), 4, None
    )
    assert entry.is_staged
    assert len(read_ledger(None)) == 0
    assert read_ledger(None).entries() == {}


def _write(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    if rows:
        write_deltalake(str(path), pa.Table.from_pylist(rows, schema))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("whole_extracts", [False, True])
def test_pending_versions_equal_the_row_by_row_difference(
    tmp_path: Path, seed: int, whole_extracts: bool
) -> None:
    rng = random.Random(seed)
    rows = random_rows(rng, rng.randrange(1, 40))
    expected_ledger = reference_ledger(rows)
    marks = [
        {
            "batch": batch,
            "file": file,
            "rows": 1,
            "landed_mtime_ns": rng.choice([None, 5]),
            "applied_at": START,
            "run_id": "a",
            "final_version": 1,
        }
        for batch, file in expected_ledger
        for _ in range(rng.choice([0, 0, 1, 2]))  # not applied, applied, marked twice
    ]
    paths = TablePaths("t", tmp_path / "landing", tmp_path / "warehouse")
    _write(Path(str(paths.ledger)), rows, LEDGER_SCHEMA)
    _write(Path(str(paths.applied)), marks, APPLIED_SCHEMA)

    done = {(m["batch"], m["file"]) for m in marks}
    staged = [
        e for e in expected_ledger.values() if e.is_staged or (whole_extracts and e.refused is None)
    ]
    pending = sorted((e for e in staged if e.ident not in done), key=lambda e: e.ident)
    batches = {e.batch for e in pending}
    whole = not any(e.ident in done for e in staged if e.batch in batches)

    found = pending_files(paths, whole_extracts=whole_extracts)
    assert (list(found.files), found.whole_batches) == (pending, whole)
    ledger = read_ledger(pa.Table.from_pylist(rows, LEDGER_SCHEMA))
    changes = [e.newest_change for i, e in expected_ledger.items() if i in done and e.newest_change]
    applied = pa.Table.from_pylist(marks, APPLIED_SCHEMA)
    assert ledger.newest_change(applied) == (max(changes) if changes else None)


def reference_fraction(rows: list[dict[str, Any]]) -> float | None:
    """The newest stage run's quarantined share, row by row (as it was at a55d9d6)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        runs.setdefault(str(row.get("run_id")), []).append(row)
    if not runs:
        return None
    oldest = datetime.min.replace(tzinfo=UTC)
    newest = max(runs.values(), key=lambda rs: max(r.get("staged_at") or oldest for r in rs))
    good = sum(int(r.get("rows_staged") or 0) for r in newest)
    bad = sum(int(r.get("rows_quarantined") or 0) for r in newest)
    return None if good + bad == 0 else bad / (good + bad)


@pytest.mark.parametrize("seed", range(40))
def test_the_newest_runs_quarantine_share_equals_the_row_by_row_one(seed: int) -> None:
    rng = random.Random(seed)
    rows = random_rows(rng, rng.randrange(1, 30))
    for row in rows:  # one run per staged_at (as runs stamp their rows)
        stamp = row["staged_at"]
        row["run_id"] = None if stamp is None else f"r{stamp.second}"
    table = pa.Table.from_pylist(rows, LEDGER_SCHEMA)
    assert last_quarantine_fraction(table) == reference_fraction(rows)
    assert last_quarantine_fraction(None) is None
