"""The driver-side store behaves the same on a local folder and on a real S3 server (moto):
listing by name with sizes, reading, replacing writes, moves, removal, walking."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_pipeline.paths import Location, ObjectPath
from spark_jobs.runtime import storage
from spark_jobs.runtime.storage import LocalStore, S3Store, Store


@pytest.fixture(params=["local", "s3"])
def store_root(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Store, Location]]:
    if request.param == "local":
        yield LocalStore(), tmp_path / "root"
        return
    server: Any = request.getfixturevalue("s3_server")
    for name, value in server.environment().items():
        monkeypatch.setenv(name, value)
    yield S3Store(), ObjectPath(server.create_bucket(), "root")


def test_the_store_lists_reads_writes_moves_and_removes_the_same_everywhere(
    store_root: tuple[Store, Location],
) -> None:
    store, root = store_root
    hour = root / "dt=2024-01-01" / "hr=00"
    assert store.list_dir(hour) == []  # a missing folder is empty
    store.write_bytes(hour / "b.json", b'{"ID": 2}\n')
    store.write_bytes(hour / "a.json", b'{"ID": 1}\n')
    store.write_bytes(hour / "a.json", b'{"ID": 11}\n')  # replaced whole
    entries = store.list_dir(hour)
    assert [(e.name, e.is_dir, e.is_link, e.size) for e in entries] == [
        ("a.json", False, False, 11),
        ("b.json", False, False, 10),
    ]
    assert all((e.mtime_ns or 0) > 0 for e in entries)
    with store.open_read(entries[0].location) as handle:
        assert handle.read() == b'{"ID": 11}\n'
    days = store.list_dir(root)
    assert [(e.name, e.is_dir) for e in days] == [("dt=2024-01-01", True)]
    target = root / "adopted" / "x.json"
    store.move(hour / "b.json", target)
    assert store.info(hour / "b.json") is None and store.info(target) is not None
    assert sorted(e.name for e in store.walk(root)) == ["a.json", "x.json"]
    store.remove(target)
    store.remove(target)  # removing what is gone is fine
    assert store.info(target) is None
    assert store.read_text(target) is None
    store.remove_tree(root / "dt=2024-01-01")
    assert [e.name for e in store.walk(root)] == []


def test_a_local_link_is_listed_as_a_link_and_never_read(tmp_path: Path) -> None:
    store = LocalStore()
    (tmp_path / "secret").write_text("x")
    (tmp_path / "link.json").symlink_to(tmp_path / "secret")
    (link,) = [e for e in store.list_dir(tmp_path) if e.name == "link.json"]
    assert link.is_link and not link.is_dir
    with pytest.raises(OSError):
        store.open_read(link.location)


def test_make_bucket_creates_missing_buckets_once_and_refuses_what_is_not_s3(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The compose file's init service: `python -m spark_jobs.runtime.storage --make-bucket` makes
    the landing and warehouse bucket on the first start and leaves it alone on the next."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    bucket = f"made-{uuid.uuid4().hex[:8]}"
    uris = [f"s3://{bucket}/landing", f"s3://{bucket}/warehouse"]
    assert storage.main(["--make-bucket", *uris]) == 0
    assert capsys.readouterr().out == f"bucket {bucket}: created\n"
    assert storage.main(["--make-bucket", *uris]) == 0
    assert capsys.readouterr().out == f"bucket {bucket}: exists\n"
    store = S3Store()
    store.write_bytes(ObjectPath(bucket, "landing/x.json"), b"{}\n")
    assert [e.name for e in store.walk(ObjectPath(bucket, "landing"))] == ["x.json"]
    assert storage.main(["--make-bucket", "/data/warehouse"]) == 2
    assert "/data/warehouse: not an s3:// URI" in capsys.readouterr().err
    assert storage.main(["--make-bucket", "gs://b/x"]) == 2
    assert "gs://b/x: the steps read and write local folders and s3://" in capsys.readouterr().err
