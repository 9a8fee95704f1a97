"""`cdc repair TABLE`: diagnose, then refuse, say nothing is damaged, print the plan (`--dry-run`)
or set the damaged tables aside, rebuild final with overwrite-final and check it.

Output, as the other commands: a repair prints one summary line on stdout (`repair t:
damaged=final changes=... final_rows=... check=ok final_aside=...`) and what it found and did
on stderr; `--dry-run` prints the diagnosis and the plan on stdout; an undamaged table is one
line. Exit 0 only when nothing needed doing, the dry run could go ahead, or the rebuilt table
passed the check; 1 when the repair is refused, fails or the check fails; 2 for an unknown
table. The `--json` document (`repair`) has the table, what was damaged, where each table set
aside went, the rebuilt final's rows and version and the check's result.

The table's DAG must be paused first (docs/operations.md, Damaged tables): the project has no
per-table lock, and a running overwrite-final that read final before it was moved would commit
into the rebuilt folder.
"""

from __future__ import annotations

import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cdc_pipeline import summaries
from cdc_pipeline.config import TableConfig, load_table_configs
from cdc_pipeline.errors import CdcError
from cdc_pipeline.paths import TablePaths
from spark_jobs.repair.aside import Move, planned_moves, set_aside
from spark_jobs.repair.diagnosis import Diagnosis, diagnose, refusal
from spark_jobs.runtime.failures import one_line


def run_repair(config: Path | None, name: str, *, dry_run: bool, force: bool) -> int:
    """`cdc repair NAME [--dry-run] [--force]`: its exit code (see the module's note)."""
    try:
        table = load_table_configs(config).table(name)
    except CdcError as error:
        print(f"error: repair: {one_line(error)}", file=sys.stderr, flush=True)
        return 2
    document: dict[str, Any] = {"table": table.name, "dry_run": dry_run, "forced": force}
    summaries.record("repair", document)
    moved: list[Move] = []
    try:
        paths = TablePaths.for_table(table.name)
        return repair_table(table, paths, document=document, moved=moved, force=force)
    except Exception as error:
        if not isinstance(error, CdcError | OSError):
            traceback.print_exc(file=sys.stderr)
        line = f"error: repair {table.name}: {one_line(error)}{after_moves(table, moved)}"
        print(line, file=sys.stderr, flush=True)
        return 1


def repair_table(
    table: TableConfig,
    paths: TablePaths,
    *,
    document: dict[str, Any],
    moved: list[Move],
    force: bool,
) -> int:
    """Diagnose; refuse, report nothing to do, print the plan or repair. `document` is the
    `--json` summary, filled in as it goes; `moved` the moves done (for a failure's line)."""
    name, dry_run = table.name, document["dry_run"]
    diagnosis = diagnose(table, paths)
    damaged = diagnosis.damaged
    rebuild = force or diagnosis.final_missing or any(d.folder == "final" for d in damaged)
    document["damaged"] = [d.document() for d in [*damaged, *diagnosis.blocking]]
    found = [d.line() for d in [*damaged, *diagnosis.blocking]]
    if diagnosis.final_missing:  # a repair cut short after its moves, or final moved by hand
        found.append(f"final ({paths.final}) is missing: it is rebuilt")
    for line in found:
        print(f"repair {name}: {line}", file=sys.stdout if dry_run else sys.stderr, flush=True)
    reason = refusal(diagnosis, rebuild_final=rebuild)
    if reason is not None:
        print(f"error: repair {name}: {reason}", file=sys.stderr, flush=True)
        return 1
    if not damaged and not rebuild:
        print(
            f"repair {name}: nothing damaged ({diagnosis.versions()}): nothing changed "
            "(--force rebuilds final anyway)",
            flush=True,
        )
        return 0
    moves = planned_moves(diagnosis.opened.values(), datetime.now(UTC), rebuild_final=rebuild)
    document["moves"] = [m.document() for m in moves]
    if dry_run:
        for line in plan_lines(diagnosis, moves, rebuild_final=rebuild):
            print(f"repair {name}: {line}", flush=True)
        return 0
    for move in moves:
        set_aside(move)
        moved.append(move)
        print(f"repair {name}: moved {move.folder} to {move.target}", file=sys.stderr, flush=True)
    return rebuild_and_check(table, paths, document=document, moves=moves)


def plan_lines(diagnosis: Diagnosis, moves: list[Move], *, rebuild_final: bool) -> list[str]:
    """What a repair would do, for `--dry-run`."""
    lines = [f"would move {m.folder} to {m.target}" for m in moves]
    into = "a new final" if rebuild_final else "final as it is (idempotent)"
    if any(m.folder == "history" for m in moves):
        into += " and a new history (cut from history_log)"
    lines.append(
        f"would apply every staged change with overwrite-final into {into}: "
        f"{diagnosis.staged_files} staged file versions, {diagnosis.staging_rows} rows in "
        f"staging, {diagnosis.remembered} rows in tombstones; then run the check"
    )
    lines.append(
        f"dry run: nothing changed; pause the DAG {diagnosis.table.dag_id} before repairing "
        "(a running overwrite-final must not race the repair)"
    )
    return lines


def rebuild_and_check(
    table: TableConfig, paths: TablePaths, *, document: dict[str, Any], moves: list[Move]
) -> int:
    """Rebuild with overwrite-final, check, print the summary line; 0 when the check passed."""
    from spark_jobs.repair.rebuild import rebuild_final
    from spark_jobs.runtime.context import StepContext
    from spark_jobs.runtime.session import build_spark_session

    spark = build_spark_session(f"cdc-repair-{table.name}")
    rebuilt = rebuild_final(StepContext(spark, table, paths))
    check = rebuilt.check
    damaged = ",".join(d["table"] for d in document["damaged"]) or "none"
    document.update(
        changes=rebuilt.counts.changes,
        final_rows=rebuilt.final_rows,
        final_version=rebuilt.final_version,
        check={"ok": check.ok, "breaches": list(check.breaches), "line": check.line()},
    )
    aside = " ".join(f"{m.folder}_aside={m.target}" for m in moves)
    print(
        f"repair {table.name}: damaged={damaged} changes={rebuilt.counts.changes} "
        f"final_rows={rebuilt.final_rows} final_version={rebuilt.final_version} "
        f"check={'ok' if check.ok else 'breach'} {aside}".rstrip(),
        flush=True,
    )
    if check.ok:
        return 0
    print(
        f"error: repair {table.name}: the rebuilt table fails the check: "
        f"{'; '.join(check.breaches)}; what was set aside is kept ({aside}): restore the damaged "
        "commit file from a backup and move the table back instead",
        file=sys.stderr,
        flush=True,
    )
    return 1


def after_moves(table: TableConfig, moved: list[Move]) -> str:
    """What a failure line adds once tables were set aside: where, and how to go on."""
    if not moved:
        return ""
    where = ", ".join(f"{m.folder} to {m.target}" for m in moved)
    return (
        f"; moved so far: {where}; run `cdc repair {table.name}` again (it rebuilds a missing "
        "final; --force one that is there)"
    )
