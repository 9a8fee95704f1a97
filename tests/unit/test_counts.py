"""A step's typed counts: the summary's keys in field order, only what the run reported, and the
same record read back from a task's JSON."""

from __future__ import annotations

from cdc_pipeline.counts import (
    NoopCounts,
    OverwriteCounts,
    StageCounts,
    VacuumCounts,
    count,
)


def test_only_reported_counts_show_in_field_order_with_flat_maps_in_place() -> None:
    counts = StageCounts(
        files=2,
        new_files=2,
        rows_read=5,
        skipped={"transaction_markers": 1, "tombstones_skipped": 0},
        staging_version=3,
    )
    assert list(counts.as_dict().items()) == [
        ("files", 2),
        ("new_files", 2),
        ("rows_read", 5),
        ("transaction_markers", 1),
        ("tombstones_skipped", 0),
        ("staging_version", 3),
    ]


def test_a_record_read_back_from_json_keeps_what_it_knows() -> None:
    payload = {
        "noop": "true",
        "files": 0,
        "rows_read": 7,
        "quarantined": 2,
        "tombstones_skipped": 1,
    }
    counts = StageCounts.of_payload(payload)
    assert (counts.files, counts.rows_read, counts.quarantined) == (0, 7, 2)
    assert counts.staged is None and count(counts.staged) == 0
    assert StageCounts.of_payload(None) == StageCounts()


def test_a_later_record_overrides_only_what_it_reports() -> None:
    planned = StageCounts(files=3, new_files=1, files_deferred=1)
    found = StageCounts(columns_added=2, operations={"inserts": 4})
    merged = planned.with_reported(found)
    assert merged.as_dict() == {
        "files": 3,
        "new_files": 1,
        "files_deferred": 1,
        "columns_added": 2,
        "inserts": 4,
    }


def test_the_rewrite_and_history_setters_fill_their_counts() -> None:
    counts = OverwriteCounts(changes=4)
    counts.rewrote(2, 10, 7)
    counts.logged(4, 1, 5, 3)
    assert counts.as_dict() == {
        "changes": 4,
        "partitions_rewritten": 2,
        "rows_written": 10,
        "final_version": 7,
        "history_changes_logged": 4,
        "history_buckets_rewritten": 1,
        "history_rows_written": 5,
        "history_version": 3,
    }


def test_a_noop_and_a_vacuum_read_as_before() -> None:
    assert NoopCounts().as_dict() == {"noop": "true", "files": 0}
    vacuum = VacuumCounts(retention_hours=168)
    vacuum.deleted["final_files_deleted"] = 2
    assert vacuum.as_dict() == {"retention_hours": 168, "final_files_deleted": 2}
