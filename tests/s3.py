"""A real S3-compatible server for the object-storage tests: moto's standalone server (PyPI,
pinned in docker/moto-requirements.txt, installed by `make test` into .tools/moto, a venv of its
own), on 127.0.0.1 in its own process group, stopped by its pid.

Why moto and not s3proxy: it is a Python package like the rest of the test tools, starts in
about a second, and implements what delta-rs and S3A rely on: conditional writes (`If-None-Match:
*` answered 412 when the key exists, which delta-rs's commit uses so concurrent writers cannot
overwrite each other's log entry), multipart uploads, ranged reads and paginated listing. It
runs as `tests/moto_server.py`, which makes that conditional write one step as AWS S3 does
(moto looks the key up, then stores the object).

One server per test session (the `s3_server` fixture); each test makes its own bucket.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cdc_airflow.local.connect_server import free_port
from cdc_pipeline.paths import project_root
from tests.helpers import stop_process_group

MOTO = project_root() / ".tools" / "moto" / "bin"
SERVER = MOTO / "moto_server"
# moto's server with conditional writes made atomic (see that file).
ATOMIC_SERVER = [str(MOTO / "python"), str(Path(__file__).with_name("moto_server.py"))]
REGION = "us-east-1"


def available() -> str | None:
    """Why moto's server cannot run here (None: it can)."""
    if not SERVER.exists():
        return f"{SERVER} is missing (make test installs it: docker/moto-requirements.txt)"
    return None


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def environment(self) -> dict[str, str]:
        """The AWS variables a client of this server needs: delta-rs and the steps' S3A settings
        both read them (spark_jobs/runtime/object_store.py)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "test-key",
            "AWS_SECRET_ACCESS_KEY": "test-secret",
            "AWS_REGION": REGION,
        }

    def create_bucket(self) -> str:
        """A new empty bucket (moto accepts unsigned requests)."""
        name = f"cdc-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200, response.status
        return name


def running(log: Path) -> Iterator[S3Server]:
    """moto's server on a free port until the generator is closed."""
    port = free_port()
    with log.open("w") as out:
        process = subprocess.Popen(
            [*ATOMIC_SERVER, "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError) as error:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"moto's server did not start:\n{log.read_text()}"
                    ) from error
                time.sleep(0.2)
        yield S3Server(endpoint)
    finally:
        stop_process_group(process, timeout=30)
