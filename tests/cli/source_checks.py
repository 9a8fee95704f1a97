"""What the real-source tests share: the source schema, a seeded OLTP workload, applying with the
real `cdc run`, and comparing every final and history table with the source database."""

from __future__ import annotations

import random
import string
from decimal import Decimal
from typing import Any

from tests import postgres
from tests.cli.cdc import cdc, summary
from tests.helpers import Workspace, table_rows

SCHEMA = """
CREATE TABLE docs (id int PRIMARY KEY, title text, body text, n int, price numeric(12,2));
CREATE TABLE sessions (id int, who text, seen timestamp, PRIMARY KEY (id, who));
"""


def table_configs(change_format: str) -> list[dict[str, Any]]:
    """docs (with history) and sessions (a composite key) in `change_format`."""
    return [
        {"name": "docs", "change_format": change_format, "keys": ["id"], "history": True},
        {"name": "sessions", "change_format": change_format, "keys": ["id", "who"]},
    ]


def body(rng: random.Random) -> str:
    """3-12 kB of random letters: stored out of line (TOASTed) even after compression."""
    return "".join(rng.choices(string.ascii_letters + string.digits, k=rng.randint(3000, 12000)))


def quote(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def run(workspace: Workspace, server_url: str, table: str, start: int, end: int) -> dict[str, str]:
    result = cdc(
        workspace,
        "run",
        table,
        "--start",
        f"2024-03-01T{start:02d}:00Z",
        "--end",
        f"2024-03-01T{end:02d}:00Z",
        CDC_SPARK_REMOTE=server_url,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return summary(result)


def normalized(rows: list[dict[str, Any]], columns: list[str]) -> list[tuple[Any, ...]]:
    def value(v: Any) -> Any:
        if isinstance(v, str) and v.replace(".", "", 1).isdigit() and "." in v:
            v = Decimal(v)  # a numeric sent as text (Debezium's decimal.handling.mode=string)
        if isinstance(v, float):
            return Decimal(str(v)).quantize(Decimal("0.01"))
        if isinstance(v, Decimal):
            return v.quantize(Decimal("0.01"))
        return v

    return sorted((tuple(value(r[c]) for c in columns) for r in rows), key=repr)


def check_equal(workspace: Workspace, pg: postgres.Postgres, checkpoint: str) -> None:
    docs_columns = ["id", "title", "body", "n", "price"]
    source_docs = normalized(pg.rows("SELECT id, title, body, n, price FROM docs"), docs_columns)
    paths = workspace.paths("docs")
    final_docs = normalized(
        [dict(zip(docs_columns, r, strict=True)) for r in table_rows(paths.final, docs_columns)],
        docs_columns,
    )
    assert len(final_docs) == len(source_docs), checkpoint
    differing = [
        (f[0], [c for c, a, b in zip(docs_columns, f, s, strict=True) if a != b])
        for f, s in zip(final_docs, source_docs, strict=True)
        if f != s
    ]
    assert not differing, f"{checkpoint}: docs rows differ (id, columns): {differing[:10]}"
    # History: the current versions are the source's rows, and no version lost its body.
    current = table_rows(
        paths.history,
        [*docs_columns, "_cdc_is_current", "_cdc_is_deleted"],
    )
    open_versions = normalized(
        [dict(zip(docs_columns, r[:5], strict=True)) for r in current if r[5] and not r[6]],
        docs_columns,
    )
    assert open_versions == source_docs, f"{checkpoint}: history's current versions"
    assert all(r[2] is not None for r in current), f"{checkpoint}: a history version lost body"
    session_columns = ["id", "who"]
    source_sessions = sorted((r["id"], r["who"]) for r in pg.rows("SELECT id, who FROM sessions"))
    final_path = workspace.paths("sessions").final
    final_sessions = table_rows(final_path, session_columns) if final_path.exists() else []
    assert final_sessions == source_sessions, f"{checkpoint}: sessions"


def workload(pg: postgres.Postgres, rng: random.Random, step: int, ids: list[int]) -> None:
    """One checkpoint's statements: inserts, title-only updates (the body stays TOASTed and is
    not sent), body updates, key changes, deletes, a burst in one transaction, and on sessions
    a truncate followed by inserts in the same transaction."""
    statements: list[str] = []
    for _ in range(8):
        new_id = max(ids, default=0) + 1
        ids.append(new_id)
        statements.append(
            f"INSERT INTO docs VALUES ({new_id}, {quote(f't{new_id}')}, {quote(body(rng))}, "
            f"{rng.randint(0, 9)}, {rng.randint(0, 99999) / 100});"
        )
    live = list(ids)
    for _ in range(12):
        doc = rng.choice(live)
        statements.append(
            f"UPDATE docs SET title = 'title {step} {rng.random():.6f}' WHERE id = {doc};"
        )
    for _ in range(3):
        doc = rng.choice(live)
        statements.append(f"UPDATE docs SET body = {quote(body(rng))} WHERE id = {doc};")
    for _ in range(2):
        doc = rng.choice(live)
        live.remove(doc)
        new_id = doc + 1000 * (step + 1)
        ids.remove(doc)
        ids.append(new_id)
        # A primary-key change: the body is not sent again, the new key must keep it.
        statements.append(f"UPDATE docs SET id = {new_id}, n = n + 1 WHERE id = {doc};")
        live.append(new_id)
    doc = rng.choice(live)
    statements.append(
        f"BEGIN; UPDATE docs SET n = 100 WHERE id = {doc}; UPDATE docs SET title = 'burst' "
        f"WHERE id = {doc}; UPDATE docs SET price = 1.25 WHERE id = {doc}; COMMIT;"
    )
    for _ in range(2):
        doc = rng.choice(live)
        live.remove(doc)
        ids.remove(doc)
        statements.append(f"DELETE FROM docs WHERE id = {doc};")
    # A NULL title and back: an explicit null is a value, not an absent column.
    doc = rng.choice(live)
    statements.append(f"UPDATE docs SET title = NULL WHERE id = {doc};")
    sessions = ", ".join(
        f"({step * 100 + i}, {quote(rng.choice(['ann', 'bob', 'cy']))}, now())" for i in range(6)
    )
    statements.append(f"INSERT INTO sessions VALUES {sessions} ON CONFLICT DO NOTHING;")
    if step % 2 == 1:
        statements.append(
            f"BEGIN; INSERT INTO sessions VALUES ({step * 100 + 50}, 'gone', now()); "
            f"TRUNCATE sessions; INSERT INTO sessions VALUES ({step * 100 + 60}, 'kept', now()); "
            "COMMIT;"
        )
    pg.sql("\n".join(statements))
