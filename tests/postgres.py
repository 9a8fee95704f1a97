"""A real PostgreSQL 15 with the wal2json plugin (Debian's postgresql-15-wal2json), started by
the tests on 127.0.0.1 as the unprivileged `postgres` user and stopped by its own postmaster pid.

One server per test session (the `postgres_server` fixture); each test creates its own
database. `capture` reads the changes since the last capture with `pg_recvlogical`
(format-version 2, include-lsn) up to the current WAL position, as a capture job would land
them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BIN = Path("/usr/lib/postgresql/15/bin")
PLUGIN = Path("/usr/lib/postgresql/15/lib/wal2json.so")
DATABASE = "postgres"
SLOT = "cdc_test"


def available() -> str | None:
    """Why a PostgreSQL with wal2json cannot run here (None: it can)."""
    if not (BIN / "postgres").exists():
        return f"{BIN / 'postgres'} is missing (apt-get install postgresql-15)"
    if not PLUGIN.exists():
        return f"{PLUGIN} is missing (apt-get install postgresql-15-wal2json)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Postgres:
    """A running server: its data folder, port, and the user it runs as."""

    root: Path
    port: int
    user: str | None  # run as this user (we are root); None: as ourselves
    database: str = DATABASE

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _as_user(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", self.user, "--", *argv] if self.user else argv

    def _run(self, argv: list[str], stdin: str | None = None) -> str:
        result = subprocess.run(
            self._as_user(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=self.root,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {result.stderr.strip()}")
        return result.stdout

    def connection(self) -> list[str]:
        return ["-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]

    def sql(self, statements: str) -> str:
        """Run SQL in one psql session (ON_ERROR_STOP): its output."""
        return self._run(
            [
                str(BIN / "psql"),
                *self.connection(),
                "-d",
                self.database,
                "-v",
                "ON_ERROR_STOP=1",
                "-q",
                "-A",
                "-t",
            ],
            stdin=statements,
        )

    def rows(self, query: str) -> list[dict[str, Any]]:
        """The query's rows as JSON objects (json_agg: numeric as JSON numbers, text exact)."""
        out = self.sql(f"SELECT coalesce(json_agg(q), '[]') FROM ({query}) q;").strip()
        return list(json.loads(out))

    def capture(self) -> list[str]:
        """The wal2json lines since the last capture (format-version 2, include-lsn)."""
        end = self.sql("SELECT pg_current_wal_lsn();").strip()
        out = self.root / "capture.json"
        out.unlink(missing_ok=True)
        self._run(
            [
                str(BIN / "pg_recvlogical"),
                *self.connection(),
                "-d",
                self.database,
                "--slot",
                SLOT,
                "--start",
                "--no-loop",
                "--endpos",
                end,
                "-o",
                "format-version=2",
                "-o",
                "include-lsn=1",
                "-o",
                "include-types=1",
                "-f",
                str(out),
            ]
        )
        text = out.read_text() if out.exists() else ""
        return [line for line in text.splitlines() if line.strip()]

    def create_database(self, name: str) -> Postgres:
        """A new database of this server (each test its own), as a handle on it."""
        self._run([str(BIN / "createdb"), *self.connection(), name])
        return dataclasses.replace(self, database=name)

    def create_slot(self) -> None:
        """The wal2json replication slot `capture` reads from."""
        self._run(
            [
                str(BIN / "pg_recvlogical"),
                *self.connection(),
                "-d",
                self.database,
                "--slot",
                SLOT,
                "--create-slot",
                "-P",
                "wal2json",
            ]
        )

    def start_again(self) -> None:
        """Start the (stopped) server on its folder and port; returns when it accepts queries."""
        self._run(
            [
                str(BIN / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.root / "server.log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        )

    def stop(self) -> None:
        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text().splitlines()[0])
        try:
            os.kill(pid, signal.SIGINT)  # fast shutdown of this postmaster only
        except ProcessLookupError:
            return
        for _ in range(300):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def start(root: Path) -> Postgres:
    """initdb and start on a free 127.0.0.1 port, with logical WAL (no database yet)."""
    user = "postgres" if os.geteuid() == 0 else None
    root.mkdir(parents=True, exist_ok=True)
    server = Postgres(root, _free_port(), user)
    if user:
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    server._run([str(BIN / "initdb"), "-D", str(server.data), "-U", "postgres", "-A", "trust"])
    settings = (
        f"port = {server.port}\nlisten_addresses = '127.0.0.1'\n"
        f"unix_socket_directories = '{root}'\nwal_level = logical\n"
        "max_replication_slots = 8\nmax_wal_senders = 8\nfsync = off\n"
        "shared_buffers = 32MB\n"
    )
    with (server.data / "postgresql.conf").open("a") as conf:
        conf.write(settings)
    # Trust on the loopback only: the server listens nowhere else. (Both files are rewritten in
    # place: they keep initdb's owner.)
    (server.data / "pg_hba.conf").write_text(
        "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        "local replication all trust\nhost replication all 127.0.0.1/32 trust\n"
    )
    server.start_again()
    return server


def scratch_root() -> Path:
    """A new folder under /tmp the `postgres` user can enter (pytest's are private to root)."""
    return Path(tempfile.mkdtemp(prefix="cdc-pg-"))


def running(root: Path) -> Iterator[Postgres]:
    """A server for the duration of the generator (stopped by its pid, its folder removed)."""
    server = start(root)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
