"""`cdc repair TABLE`: a damaged final (and history) is set aside and rebuilt from staging and the
remembered deletes, exactly, also after a reset-staging and on S3; an undamaged table and a dry
run change nothing; a damaged staging is refused with the manual step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cdc_pipeline.paths import Location
from spark_jobs.runtime.storage import store_for
from tests.cli.cdc import cdc, summary
from tests.cli.test_concurrency_and_crashes import YEARLY, change, hour
from tests.helpers import Workspace, exists, table_rows
from tests.reference import latest_state

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TABLE = {**YEARLY, "history": True}
FINAL = ["ID", "VALUE", "Y"]


def at(h: int, minute: int) -> str:
    return f"2024-01-01 {h:02d}:{minute:02d}:00"


# The change files of each hour: inserts, updates (two of them move a key to another year's
# partition), key-only deletes, a delete of key 6 that was never inserted (only tombstones know
# it) and, in hour 3, changes ordered before deletes applied earlier (6 and 2 must stay gone).
HOURS: dict[int, list[dict[str, Any]]] = {
    0: [change("I", i, 2020 + i % 3, i, at(0, 10)) for i in (1, 2, 3, 4, 5)],
    1: [
        change("U", 1, 2023, 11, at(1, 10)),
        change("D", 2, None, None, at(1, 10)),
        change("U", 3, 2021, 31, at(1, 20)),
        change("I", 7, 2022, 7, at(1, 30)),
    ],
    2: [
        change("D", 6, None, None, at(2, 10)),
        change("U", 4, 2020, 41, at(2, 10)),
        change("D", 5, None, None, at(2, 20)),
    ],
    3: [
        change("I", 6, 2020, 6, at(0, 30)),
        change("U", 2, 2020, 22, at(0, 40)),
        change("U", 7, 2022, 71, at(3, 10)),
        change("I", 8, 2023, 8, at(3, 10)),
    ],
    4: [
        change("I", 2, 2024, 23, at(4, 10)),
        change("D", 1, None, None, at(4, 10)),
        change("U", 8, 2023, 81, at(4, 20)),
        change("I", 9, 2021, 9, at(4, 20)),
    ],
}


def land(workspace: Workspace, h: int) -> None:
    workspace.land("t", f"2024-01-01T{h:02d}", f"h{h}.csv", HOURS[h])


def expected(hours: range) -> list[tuple[Any, ...]]:
    """Final's rows by the reference model: the latest change of every key over the hours."""
    changes = [
        {**row, "_arrival": (f"2024-01-01T{h:02d}", f"h{h}.csv", position)}
        for h in hours
        for position, row in enumerate(HOURS[h])
    ]
    state = latest_state(changes, ["ID"], lambda c: (c["TS"],))
    rows = [(c["ID"], c["VALUE"], int(c["D"][-4:])) for c in state.values()]
    return sorted(rows, key=repr)


def tree(location: Location) -> dict[str, tuple[int, int | None]]:
    """Every file under the folder with its size and modification time."""
    return {str(e.location): (e.size, e.mtime_ns) for e in store_for(location).walk(location)}


def damage(table: Location) -> tuple[int, bytes]:
    """Truncate the newest commit file of the table's log: (its version, its bytes now)."""
    log = table / "_delta_log"
    store = store_for(log)
    newest = max(e.name for e in store.list_dir(log) if e.name.endswith(".json"))
    text = store.read_text(log / newest) or ""
    store.write_bytes(log / newest, text[: len(text) // 2].encode())
    return int(newest.removesuffix(".json")), text[: len(text) // 2].encode()


def run_hours(workspace: Workspace, hours: range, **extra: str) -> None:
    for h in hours:
        land(workspace, h)
        ran = cdc(workspace, "run", "t", *hour(h), **extra)
        assert ran.returncode == 0, ran.stderr


def test_a_damaged_final_and_history_are_set_aside_and_rebuilt_exactly(
    any_workspace: Workspace,
) -> None:
    workspace = any_workspace
    workspace.configure(TABLE)
    paths = workspace.paths("t")
    run_hours(workspace, range(3))
    reset = cdc(workspace, "reset-staging", "t")
    assert reset.returncode == 0, reset.stderr
    counts = summary(reset)
    assert int(counts["rows_after"]) < int(counts["rows_before"])  # staging was compacted
    run_hours(workspace, range(3, 4))
    before = table_rows(paths.final, FINAL)
    assert before == expected(range(4))
    assert (6,) in table_rows(paths.tombstones, ["ID"])  # a delete only tombstones remember
    version, damaged_bytes = damage(paths.final)
    history_version, _ = damage(paths.history)
    untouched = tree(workspace.warehouse)

    dry = cdc(workspace, "repair", "t", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert tree(workspace.warehouse) == untouched  # a dry run changes nothing
    lines = dry.stdout.splitlines()
    assert lines[0].startswith(
        f"repair t: final ({paths.final}): version {version}, "
        f"_delta_log/{version:020d}.json is damaged ("
    )
    assert lines[1].startswith(f"repair t: history ({paths.history}): version {history_version}")
    assert lines[2].startswith(f"repair t: would move final to {paths.final}.damaged-")
    assert lines[3].startswith(f"repair t: would move history to {paths.history}.damaged-")
    assert lines[4].startswith(f"repair t: would move applied to {paths.applied}.replaced-")
    assert lines[-1].startswith("repair t: dry run: nothing changed; pause the DAG cdc_t")

    repaired = cdc(workspace, "repair", "t", "--json")
    assert repaired.returncode == 0, repaired.stderr
    document = json.loads(repaired.stdout)["repair"]
    assert [d["table"] for d in document["damaged"]] == ["final", "history"]
    assert document["damaged"][0]["where"] == f"version {version}, _delta_log/{version:020d}.json"
    moves = {m["table"]: m for m in document["moves"]}
    assert sorted(moves) == ["applied", "final", "history"]
    assert document["final_rows"] == len(before)
    assert document["check"]["ok"], document["check"]
    assert table_rows(paths.final, FINAL) == before  # the rows final held before the damage
    kept = store_for(paths.final).read_text(
        paths.final.parent / Path(moves["final"]["to"]).name / "_delta_log" / f"{version:020d}.json"
    )
    assert (kept or "").encode() == damaged_bytes  # the damaged table is kept aside as it was
    assert exists(paths.applied.parent / Path(moves["applied"]["to"]).name / "_delta_log")

    run_hours(workspace, range(4, 5))  # a later run applies new changes on the rebuilt table
    assert table_rows(paths.final, FINAL) == expected(range(5))
    checked = cdc(workspace, "check", "t")
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture(scope="module")
def applied_once(tmp_path_factory: pytest.TempPathFactory, connect_server: Any) -> Workspace:
    """Hours 0 and 1 applied by one run (the Connect server's client, as the tests' runs)."""
    base = Workspace(tmp_path_factory.mktemp("applied-once"))
    base.configure(TABLE)
    land(base, 0)
    land(base, 1)
    ran = cdc(base, "run", "t", *hour(0)[:2], *hour(1)[2:], CDC_SPARK_REMOTE=connect_server.url)
    assert ran.returncode == 0, ran.stderr
    return base


def copy_of(base: Workspace, tmp_path: Path) -> Workspace:
    shutil.copytree(base.root, tmp_path / "copy")
    return Workspace(tmp_path / "copy")


def test_an_undamaged_table_is_left_alone_in_one_line(
    applied_once: Workspace, tmp_path: Path
) -> None:
    workspace = copy_of(applied_once, tmp_path)
    untouched = tree(workspace.warehouse)
    result = cdc(workspace, "repair", "t")
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("repair t: nothing damaged (final@")
    assert line.endswith("): nothing changed (--force rebuilds final anyway)")
    assert tree(workspace.warehouse) == untouched


def test_a_dry_run_names_the_damage_and_the_plan_and_changes_nothing(
    applied_once: Workspace, tmp_path: Path
) -> None:
    workspace = copy_of(applied_once, tmp_path)
    paths = workspace.paths("t")
    version, _ = damage(paths.final)
    untouched = tree(workspace.warehouse)
    result = cdc(workspace, "repair", "t", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["repair"]["dry_run"] is True
    assert [m["table"] for m in document["repair"]["moves"]] == ["final", "applied"]
    output = document["output"]
    assert f"_delta_log/{version:020d}.json is damaged (" in output[0]
    assert output[-2].startswith("repair t: would apply every staged change with overwrite-final")
    assert tree(workspace.warehouse) == untouched
    assert table_rows(paths.applied, ["file"]) == [("h0.csv",), ("h1.csv",)]


def test_a_damaged_staging_is_refused_with_the_manual_step(
    applied_once: Workspace, tmp_path: Path
) -> None:
    workspace = copy_of(applied_once, tmp_path)
    paths = workspace.paths("t")
    damage(paths.final)
    version, _ = damage(paths.staging)
    untouched = tree(workspace.warehouse)
    result = cdc(workspace, "repair", "t")
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"error: repair t: staging is damaged (version {version}, _delta_log/{version:020d}.json: "
    )
    assert "final is rebuilt from staging, never staging from final: restore staging's" in line
    assert "rebuild staging from the landing zone (move staging, ledger and applied aside" in line
    assert tree(workspace.warehouse) == untouched
