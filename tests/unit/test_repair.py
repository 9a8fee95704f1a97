"""`cdc repair`'s parts without Spark: the move aside (a rename locally, a verified copy then the
deletes on S3, log first), what is set aside, the refusals, and the damaged-table error naming
the repair."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from cdc_pipeline.config import TableConfig, parse_config
from cdc_pipeline.errors import CdcError, TableDamagedError
from cdc_pipeline.paths import Location, ObjectPath, TablePaths
from spark_jobs import delta
from spark_jobs.landing import LEDGER_SCHEMA, ledger_row
from spark_jobs.repair.aside import Move, aside_name, planned_moves, set_aside
from spark_jobs.repair.diagnosis import Damage, Opened, diagnose, refusal
from spark_jobs.runtime.storage import Entry, Store, store_for

STAMP = datetime(2026, 11, 29, 9, 30, tzinfo=UTC)


@pytest.fixture(params=["local", "s3"])
def root(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Location]:
    if request.param == "local":
        yield tmp_path / "t"
        return
    server: Any = request.getfixturevalue("s3_server")
    for name, value in server.environment().items():
        monkeypatch.setenv(name, value)
    yield ObjectPath(server.create_bucket(), "warehouse/t")


def files(store: Store, folder: Location) -> dict[str, bytes]:
    prefix = f"{folder}/"
    found = {}
    for entry in store.walk(folder):
        with store.open_read(entry.location) as handle:
            found[str(entry.location).removeprefix(prefix)] = handle.read()
    return found


def test_a_table_is_moved_aside_whole_and_the_source_is_gone(root: Location) -> None:
    final = root / "final"
    write_deltalake(str(final), pa.table({"ID": [1, 2]}), partition_by=None)
    write_deltalake(str(final), pa.table({"ID": [3]}), mode="append")
    store = store_for(final)
    before = files(store, final)
    target = aside_name(final, STAMP, damaged=True)
    assert str(target) == f"{root}/final.damaged-20261129T093000Z"
    set_aside(Move("final", final, target))
    assert files(store, target) == before
    assert store.info(final) is None or files(store, final) == {}
    assert delta.open_table(final) is None
    assert sorted(delta.arrow_table_rows(target, ["ID"]), key=str) == [
        {"ID": 1},
        {"ID": 2},
        {"ID": 3},
    ]
    with pytest.raises(Exception, match="exists already"):
        set_aside(Move("final", target, target))  # never over an earlier copy


def test_what_is_set_aside_follows_the_damage() -> None:
    def opened(folder: str, *, version: int | None = 1, damaged: bool = False) -> Opened:
        path = Path("/w/t") / folder
        damage = Damage(folder, path, "version 1, x", "bad") if damaged else None
        return Opened(folder, path, None if damaged else version, damage)

    tables = [opened("final", damaged=True), opened("history"), opened("applied")]
    moves = planned_moves(tables, STAMP, rebuild_final=True)
    assert [(m.folder, m.target.name) for m in moves] == [
        ("final", "final.damaged-20261129T093000Z"),
        ("applied", "applied.replaced-20261129T093000Z"),
    ]
    only_applied = [opened("final"), opened("applied", damaged=True)]
    moves = planned_moves(only_applied, STAMP, rebuild_final=False)
    assert [m.target.name for m in moves] == ["applied.damaged-20261129T093000Z"]
    missing = [opened("final", version=None), opened("applied", version=None)]
    assert planned_moves(missing, STAMP, rebuild_final=True) == []


def row(name: str, **fields: Any) -> TableConfig:
    base = {"name": name, "file_format": "parquet", "keys": ["ID"], "sequence_by": ["TS"]}
    result = parse_config({"tables": [{**base, **fields}]})
    assert not result.problems
    return result.tables[name]


def write_ledger(paths: TablePaths, staged: list[int]) -> None:
    now = datetime.now(UTC)
    rows = [
        ledger_row(
            None,
            "2024-01-01T00",
            f"f{i}",
            staged=n,
            quarantined=0,
            refused=None,
            now=now,
            run_id="r",
        )
        for i, n in enumerate(staged)
    ]
    write_deltalake(str(paths.ledger), pa.Table.from_pylist(rows, LEDGER_SCHEMA))


def test_an_insert_only_staging_compacted_by_a_reset_is_refused(tmp_path: Path) -> None:
    paths = TablePaths("t", tmp_path / "landing", tmp_path / "warehouse")
    write_ledger(paths, [3, 2])
    write_deltalake(str(paths.staging), pa.table({"ID": [1, 2]}))  # 2 of the 5 staged events
    write_deltalake(str(paths.tombstones), pa.table({"ID": pa.array([], pa.int64())}))
    events = diagnose(row("t", insert_only=True), paths)
    assert (events.staged_files, events.staged_rows, events.staging_rows) == (2, 5, 2)
    reason = refusal(events, rebuild_final=True)
    assert reason is not None
    assert reason.startswith("staging holds 2 of the 5 events the ledger says were staged")
    assert refusal(events, rebuild_final=False) is None  # final kept: nothing lost
    upserts = diagnose(row("t"), paths)  # an upsert table's staging keeps every key's latest
    assert refusal(upserts, rebuild_final=True) is None


def test_a_damaged_source_refuses_and_the_error_names_the_repair(tmp_path: Path) -> None:
    paths = TablePaths("t", tmp_path / "landing", tmp_path / "warehouse")
    write_ledger(paths, [1])
    for path in (paths.final, paths.staging, paths.tombstones):
        write_deltalake(str(path), pa.table({"ID": [1]}))
    for path in (paths.final, paths.tombstones):
        (path / "_delta_log" / "00000000000000000000.json").write_text('{"commitInfo": {')
    with pytest.raises(TableDamagedError) as raised:
        delta.open_table(paths.final)
    assert str(raised.value).endswith(
        "version 0, _delta_log/00000000000000000000.json is damaged. Retrying does not help: "
        "restore that commit file from a backup, or rebuild it with `cdc repair t` "
        "(docs/operations.md, Damaged tables)"
    )
    found = diagnose(row("t"), paths)
    assert [d.folder for d in found.damaged] == ["final"]
    assert [d.folder for d in found.blocking] == ["tombstones"]
    reason = refusal(found, rebuild_final=True) or ""
    assert reason.startswith(
        "tombstones is damaged (version 0, _delta_log/00000000000000000000.json: "
    )
    assert "restore tombstones' commit file from a backup" in reason


class RecordingStore:
    """Objects in memory: what set_aside copies and removes, in order (an S3 stand-in)."""

    def __init__(self, objects: dict[str, bytes], *, lose: str | None = None) -> None:
        self.objects = dict(objects)
        self.removed: list[str] = []
        self.lose = lose  # a copy of this object silently goes missing

    def walk(self, folder: Location) -> Iterator[Entry]:
        for name in sorted(n for n in self.objects if n.startswith(f"{folder}/")):
            location = ObjectPath.parse(name)
            yield Entry(location.name, location, False, False, len(self.objects[name]), 1)

    def info(self, location: Location) -> Entry | None:
        return next(iter(self.walk(location)), None)

    def copy(self, source: Location, target: Location) -> None:
        if str(source) != self.lose:
            self.objects[str(target)] = self.objects[str(source)]

    def remove(self, location: Location) -> None:
        self.removed.append(str(location))
        del self.objects[str(location)]


def test_on_s3_the_copy_is_verified_and_the_log_removed_before_the_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    final = ObjectPath("b", "w/t/final")
    objects = {
        f"{final}/Y=2020/part-1.parquet": b"1",
        f"{final}/_delta_log/00000000000000000000.json": b"{}",
        f"{final}/_delta_log/00000000000000000001.json": b"{",
        f"{final}/part-2.parquet": b"22",
    }
    target = aside_name(final, STAMP, damaged=True)
    lossy = RecordingStore(objects, lose=f"{final}/part-2.parquet")
    monkeypatch.setattr("spark_jobs.repair.aside.store_for", lambda _: lossy)
    with pytest.raises(CdcError, match="gave 3 objects for 4"):
        set_aside(Move("final", final, target))
    assert lossy.removed == []  # nothing deleted after a copy that does not match
    store = RecordingStore(objects)
    monkeypatch.setattr("spark_jobs.repair.aside.store_for", lambda _: store)
    set_aside(Move("final", final, target))
    assert [name.removeprefix(f"{final}/") for name in store.removed] == [
        "_delta_log/00000000000000000000.json",
        "_delta_log/00000000000000000001.json",
        "Y=2020/part-1.parquet",
        "part-2.parquet",
    ]
    assert sorted(store.objects) == sorted(
        name.replace(f"{final}/", f"{target}/") for name in objects
    )
