"""`cdc demo`'s backfill request: it runs the demo's hours again in a home that has them; a
retried POST that finds its own backfill running returns it; another one running is named."""

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
    """The REST calls queue_backfill makes: the POST answers 409 (a backfill is running)."""

    def __init__(self, running: list[dict[str, Any]]) -> None:
        self.running = running
        self.calls: list[tuple[str, str]] = []
        self.bodies: list[dict[str, Any] | None] = []

    def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        self.calls.append((method, path))
        self.bodies.append(body)
        if method == "POST":
            raise urllib.error.HTTPError(path, 409, "Conflict", {}, io.BytesIO())  # type: ignore[arg-type]
        if method == "GET":
            return {"backfills": self.running}
        return {}


def backfill(ident: int, first: str, last: str, completed: str | None = None) -> dict[str, Any]:
    return {"id": ident, "from_date": first, "to_date": last, "completed_at": completed}


def test_a_conflict_returns_the_running_backfill_of_the_same_dates() -> None:
    local = FakeAirflow(
        [
            backfill(1, "2024-01-01T00:00:00Z", "2024-01-01T02:00:00Z", "2024-01-02T00:00:00Z"),
            backfill(2, "2024-01-01T00:00:00Z", "2024-01-01T02:00:00Z"),
        ]
    )
    assert queue_backfill(local, "cdc_t", FIRST, LAST)["id"] == 2  # type: ignore[arg-type]
    assert local.calls == [
        ("PATCH", "/dags/cdc_t?update_mask=is_paused"),
        ("POST", "/backfills"),
        ("GET", "/backfills?dag_id=cdc_t"),
    ]
    # The demo's home keeps the runs of the demos before: its hours run again all the same.
    posted = local.bodies[1]
    assert posted is not None and posted["reprocess_behavior"] == "completed"


def test_a_conflict_with_another_running_backfill_names_it_and_the_fix() -> None:
    # Another range is running (or the one of these dates has completed): not ours.
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


def test_a_conflict_without_a_running_backfill_is_raised_as_it_came() -> None:
    local = FakeAirflow([])
    with pytest.raises(urllib.error.HTTPError) as raised:
        queue_backfill(local, "cdc_t", FIRST, LAST)  # type: ignore[arg-type]
    assert raised.value.code == 409
