"""The view's runs, attempts and backfills, read from a metadata DB of Airflow's own schema.

The tables are created from Airflow's models (`Base.metadata.create_all`, on SQLite) and filled
as the scheduler leaves them mid-backfill: a run failed after its retries, one retrying, one
running its second try, runs queued, a backfill that skipped a date. The view's queries run on
them through Airflow's own session, as they do in the api-server.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_airflow.view.runs import BackfillProgress, active_backfills, recent_runs, run_document

NOW = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def hour(n: int) -> datetime:
    return datetime(2024, 1, 1, tzinfo=UTC) + timedelta(hours=n)


class MetadataDB:
    """Airflow's metadata tables on a private SQLite file, and the statements run on them."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.statements: list[str] = []
        self._next_run = 0

    def insert(self, model: Any, **values: Any) -> Any:
        from sqlalchemy import insert

        with self.engine.begin() as connection:
            return connection.execute(
                insert(model.__table__).values(**values)
            ).inserted_primary_key[0]

    def run(self, dag_id: str, run_id: str, state: str, *, start: int, **extra: Any) -> int:
        """A DAG run over the hour `start` (its start the end of that hour), its key."""
        from airflow.models.dagrun import DagRun

        self._next_run += 1
        values = {
            "dag_id": dag_id,
            "run_id": run_id,
            "state": state,
            "run_type": "backfill",
            "logical_date": hour(start),
            "data_interval_start": hour(start),
            "data_interval_end": hour(start + 1),
            "run_after": hour(start + 1),
            "queued_at": NOW - timedelta(hours=2),
            "start_date": NOW - timedelta(minutes=60 - start),
            **extra,
        }
        return int(self.insert(DagRun, id=self._next_run, **values))

    def task(self, dag_id: str, run_id: str, task_id: str, state: str, **extra: Any) -> None:
        from airflow.models.taskinstance import TaskInstance

        values = {"try_number": 1, "max_tries": 2, "pool": "default_pool", **extra}
        self.insert(
            TaskInstance, dag_id=dag_id, run_id=run_id, task_id=task_id, state=state, **values
        )

    def error(self, run_key: int, dag_id: str, run_id: str, task_id: str, line: str) -> None:
        """The step's one-line error, as the operator pushes it (XCom cdc_error)."""
        from airflow.models.xcom import XComModel

        from cdc_pipeline.steps import ERROR_XCOM

        self.insert(
            XComModel,
            dag_run_id=run_key,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=-1,
            key=ERROR_XCOM,
            value=line,
        )


@pytest.fixture
def metadata_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MetadataDB]:
    """Airflow's schema on SQLite, Airflow's session pointed at it for the test."""
    from airflow import settings
    from airflow.models import import_all_models
    from airflow.models.base import Base
    from sqlalchemy import create_engine, event
    from sqlalchemy.orm import scoped_session, sessionmaker

    import_all_models()
    engine = create_engine(f"sqlite:///{tmp_path / 'airflow.db'}")
    Base.metadata.create_all(engine)
    db = MetadataDB(engine)
    event.listen(engine, "before_cursor_execute", lambda *args: db.statements.append(str(args[2])))
    maker = sessionmaker(bind=engine, expire_on_commit=False)
    monkeypatch.setattr(settings, "NonScopedSession", maker)
    monkeypatch.setattr(settings, "Session", scoped_session(maker))
    yield db
    engine.dispose()


def mid_backfill(db: MetadataDB) -> None:
    """cdc_alpha: a backfill of 9 hours, one of them already run by the scheduler (skipped),
    of its 8 runs 1 succeeded, 1 failed after 3 tries, 1 running its second try, 5 queued; an
    older backfill completed. cdc_beta: a scheduled run whose stage waits to retry."""
    from airflow.models.backfill import Backfill, BackfillDagRun

    old = db.insert(
        Backfill, dag_id="cdc_alpha", from_date=hour(-5), to_date=hour(-4), completed_at=NOW
    )
    backfill = db.insert(Backfill, dag_id="cdc_alpha", from_date=hour(0), to_date=hour(8))
    runs = [
        db.run("cdc_alpha", "backfill__00", "success", start=0, backfill_id=backfill),
        db.run("cdc_alpha", "backfill__01", "failed", start=1, backfill_id=backfill),
        db.run("cdc_alpha", "backfill__02", "running", start=2, backfill_id=backfill),
        *(
            db.run("cdc_alpha", f"backfill__0{h}", "queued", start=h, backfill_id=backfill)
            for h in range(3, 8)
        ),
    ]
    for ordinal, key in enumerate(runs, start=1):
        db.insert(BackfillDagRun, backfill_id=backfill, dag_run_id=key, sort_ordinal=ordinal)
    db.insert(
        BackfillDagRun,
        backfill_id=backfill,
        dag_run_id=None,
        exception_reason="already exists",
        sort_ordinal=9,
    )
    db.run("cdc_alpha", "backfill__old", "success", start=-5, backfill_id=old)
    db.task("cdc_alpha", "backfill__00", "stage", "success")
    db.task("cdc_alpha", "backfill__01", "stage", "failed", try_number=3)
    db.task("cdc_alpha", "backfill__01", "overwrite_final", "upstream_failed", try_number=0)
    db.error(runs[1], "cdc_alpha", "backfill__01", "stage", "error: stage alpha: no column ID")
    db.task("cdc_alpha", "backfill__02", "stage", "success")
    running = {"try_number": 2, "start_date": NOW - timedelta(seconds=80)}
    db.task("cdc_alpha", "backfill__02", "overwrite_final", "running", **running)
    key = db.run("cdc_beta", "scheduled__10", "running", start=10, run_type="scheduled")
    waiting = {"start_date": NOW - timedelta(minutes=3), "end_date": NOW - timedelta(minutes=2)}
    db.task("cdc_beta", "scheduled__10", "stage", "up_for_retry", **waiting)
    db.error(key, "cdc_beta", "scheduled__10", "stage", "error: stage beta: broker unreachable")


def test_runs_carry_their_type_and_the_tries_of_the_tasks_going_on_or_failed(
    metadata_db: MetadataDB,
) -> None:
    mid_backfill(metadata_db)
    runs = recent_runs(["cdc_alpha", "cdc_beta", "cdc_gamma"])
    assert runs["cdc_gamma"] == []  # no run: an empty list, not a missing key
    alpha = {r.run_id: r for r in runs["cdc_alpha"]}
    assert {r.run_type for r in alpha.values()} == {"backfill"}
    assert alpha["backfill__00"].attempts == ()  # a successful run: no attempt to show
    (failed,) = alpha["backfill__01"].attempts  # not the upstream_failed task after it
    assert (failed.task_id, failed.state, failed.try_number, failed.tries) == (
        "stage",
        "failed",
        3,
        3,
    )
    assert failed.reason == "error: stage alpha: no column ID"
    assert alpha["backfill__01"].failures == (("stage", "error: stage alpha: no column ID"),)
    (running,) = alpha["backfill__02"].attempts
    assert (running.task_id, running.state, running.try_number, running.tries) == (
        "overwrite_final",
        "running",
        2,
        3,
    )
    assert running.started == NOW - timedelta(seconds=80) and running.reason is None
    assert alpha["backfill__02"].failures == ()
    assert [alpha[f"backfill__0{h}"].state for h in range(3, 8)] == ["queued"] * 5
    (beta,) = runs["cdc_beta"]
    assert beta.run_type == "scheduled" and beta.backfill_id is None
    (retrying,) = beta.attempts
    assert (retrying.state, retrying.try_number, retrying.tries) == ("up_for_retry", 1, 3)
    assert retrying.reason == "error: stage beta: broker unreachable"
    document = run_document(alpha["backfill__02"])
    assert document is not None and document["attempts"] == [
        {
            "task_id": "overwrite_final",
            "state": "running",
            "try_number": 2,
            "tries": 3,
            "started": "2024-03-01T11:58:40+00:00",
            "ended": None,
            "reason": None,
        }
    ]
    assert (document["run_type"], document["backfill_id"]) == ("backfill", 2)


def test_a_backfill_in_progress_counts_its_runs_by_state_and_the_dates_it_skipped(
    metadata_db: MetadataDB,
) -> None:
    mid_backfill(metadata_db)
    backfills = active_backfills(["cdc_alpha", "cdc_beta"])
    assert backfills["cdc_beta"] == []
    (progress,) = backfills["cdc_alpha"]  # the completed one is not shown
    assert progress == BackfillProgress(
        backfill_id=2,
        from_date=hour(0),
        to_date=hour(8),
        paused=False,
        states={"success": 1, "failed": 1, "running": 1, "queued": 5},
        skipped=1,
    )
    assert (progress.runs, progress.done, progress.summary) == (8, 2, "2 of 8 runs done")
    assert progress.document()["summary"] == "2 of 8 runs done"


def test_the_queries_are_as_many_for_one_table_as_for_many(metadata_db: MetadataDB) -> None:
    mid_backfill(metadata_db)
    metadata_db.statements.clear()
    recent_runs(["cdc_alpha"])
    active_backfills(["cdc_alpha"])
    one = len(metadata_db.statements)
    metadata_db.statements.clear()
    recent_runs([f"cdc_t{n}" for n in range(50)] + ["cdc_alpha", "cdc_beta"])
    active_backfills([f"cdc_t{n}" for n in range(50)] + ["cdc_alpha", "cdc_beta"])
    assert len(metadata_db.statements) == one == 5, metadata_db.statements
