"""`cdc demo`'s backfill request: it runs the demo's hours again in a home that has them; a
backfill of the same dates left open is cancelled and queued again (or, not reprocessing,
returned); one of other dates is named with the fix."""

from __future__ import annotations

import io
import urllib.error
from datetime import UTC, datetime
from typing import Any

import pytest

from cdc_tools.demo import queue_backfill

FIRST = datetime(2024, 1, 1, 0, tzinfo=UTC)
LAST = datetime(2024, 1, 1, 2, tzinfo=UTC)


class FakeAirflow:
    """The REST calls queue_backfill makes: a POST answers 409 while a backfill is open."""

    def __init__(self, running: list[dict[str, Any]]) -> None:
        self.running = running
        self.calls: list[tuple[str, str]] = []
        self.bodies: list[dict[str, Any] | None] = []

    def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        self.calls.append((method, path))
        self.bodies.append(body)
        if method == "POST":
            if any(b["completed_at"] is None for b in self.running):
                raise urllib.error.HTTPError(path, 409, "Conflict", {}, io.BytesIO())  # type: ignore[arg-type]
            return {"id": 3, **(body or {})}
        if method == "PUT":  # /backfills/<id>/cancel
            ident = int(path.split("/")[2])
            for b in self.running:
                if b["id"] == ident:
                    b["completed_at"] = "2024-01-03T00:00:00Z"
            return {}
        if method == "GET":
            return {"backfills": self.running}
        return {}


def backfill(ident: int, first: str, last: str, completed: str | None = None) -> dict[str, Any]:
    return {"id": ident, "from_date": first, "to_date": last, "completed_at": completed}


def test_the_demos_hours_run_again_in_a_home_that_has_them() -> None:
    local = FakeAirflow([])
    assert queue_backfill(local, "cdc_t", FIRST, LAST)["id"] == 3  # type: ignore[arg-type]
    posted = local.bodies[1]
    assert posted is not None and posted["reprocess_behavior"] == "completed"
    assert (posted["from_date"], posted["to_date"]) == (FIRST.isoformat(), LAST.isoformat())


def test_an_open_backfill_of_the_same_dates_is_cancelled_and_queued_again() -> None:
    # Left by a POST whose answer was lost, a demo stopped half-way, or a scheduler stopped
    # before marking it completed (its runs done: taken over, nothing would run again).
    local = FakeAirflow(
        [
            backfill(1, "2024-01-01T00:00:00Z", "2024-01-01T02:00:00Z", "2024-01-02T00:00:00Z"),
            backfill(2, "2024-01-01T00:00:00Z", "2024-01-01T02:00:00Z"),
        ]
    )
    assert queue_backfill(local, "cdc_t", FIRST, LAST)["id"] == 3  # type: ignore[arg-type]
    assert local.calls == [
        ("PATCH", "/dags/cdc_t?update_mask=is_paused"),
        ("POST", "/backfills"),
        ("GET", "/backfills?dag_id=cdc_t"),
        ("PUT", "/backfills/2/cancel"),
        ("POST", "/backfills"),
    ]


def test_without_reprocessing_the_open_backfill_of_the_same_dates_is_returned() -> None:
    local = FakeAirflow([backfill(2, "2024-01-01T00:00:00Z", "2024-01-01T02:00:00Z")])
    found = queue_backfill(local, "cdc_t", FIRST, LAST, reprocess="none")  # type: ignore[arg-type]
    assert found["id"] == 2 and ("PUT", "/backfills/2/cancel") not in local.calls


def test_a_conflict_with_another_running_backfill_names_it_and_the_fix() -> None:
    # Another range is running (the one of these dates has completed): not the demo's.
    local = FakeAirflow(
        [
            backfill(1, "2024-01-01T00:00:00Z", "2024-01-01T05:00:00Z"),
            backfill(2, "2024-01-01T00:00:00Z", "2024-01-01T02:00:00Z", "2024-01-02T00:00:00Z"),
        ]
    )
    with pytest.raises(RuntimeError) as raised:
        queue_backfill(local, "cdc_t", FIRST, LAST)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "cdc_t has a backfill running from 2024-01-01T00:00:00Z to 2024-01-01T05:00:00Z (id 1): "
        "let it finish or cancel it in the Airflow UI (`make airflow`, the DAG's page), then run "
        "the demo again"
    )
    assert not any(method == "PUT" for method, _ in local.calls)


class RefusingAirflow(FakeAirflow):
    def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if method == "POST":
            raise urllib.error.HTTPError(path, 409, "Conflict", {}, io.BytesIO())  # type: ignore[arg-type]
        return super().rest(method, path, body)


def test_a_conflict_without_an_open_backfill_is_raised_as_it_came() -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        queue_backfill(RefusingAirflow([]), "cdc_t", FIRST, LAST)  # type: ignore[arg-type]
    assert raised.value.code == 409
