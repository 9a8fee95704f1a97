"""The driver side's file system: one small adapter for a local (or mounted) folder and for
object storage (`s3://bucket/prefix`), so the steps list landing folders, read files, adopt
written files and clean up through one interface instead of `os`/`pathlib` calls.

NOT WIRED INTO THE STEPS YET (issue 25, item 2): this is the first piece of object storage for the
steps. `LocalStore` is meant to hold today's calls verbatim (`os.scandir`, `os.open` with
`O_NOFOLLOW`, `os.replace`), so the hostile-name and symlink behaviour stays what the tests pin;
`S3Store` is the same interface over `pyarrow.fs.S3FileSystem`, configured from the AWS
environment variables delta-rs and the Spark sessions read (spark_jobs/object_store.py).

Object storage has no links and no atomic rename: `move` there is copy + delete (a file the
steps adopt is written once, under a name nobody else uses, so a crash between the two leaves a
copy the next run's recovery finds, as a crash between Spark's write and the commit does today).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Entry:
    """One entry of a folder listing."""

    name: str
    location: str  # the full path or URI of the entry
    is_dir: bool
    is_link: bool  # a symbolic link (never on object storage)
    size: int
    mtime_ns: int


class Store(Protocol):
    """What the steps do with files on the driver side."""

    def list_dir(self, location: str) -> list[Entry]:
        """The folder's entries, by name (a missing folder: an empty list)."""

    def open_read(self, location: str) -> IO[bytes]:
        """A regular file's bytes, never through a link."""

    def exists(self, location: str) -> bool: ...

    def write_bytes(self, location: str, data: bytes) -> None:
        """The whole file, replaced at once for readers."""

    def move(self, source: str, target: str) -> None:
        """`source` to `target` (parent folders made); replaces `target`."""

    def remove(self, location: str) -> None:
        """The file, if it exists."""

    def remove_tree(self, location: str) -> None:
        """The folder and everything under it, if it exists."""

    def join(self, location: str, *parts: str) -> str: ...


class LocalStore:
    """A local or mounted folder: os calls, links never followed."""

    def list_dir(self, location: str) -> list[Entry]:
        try:
            with os.scandir(location) as entries:
                found = []
                for entry in entries:
                    info = entry.stat(follow_symlinks=False)
                    found.append(
                        Entry(
                            entry.name,
                            entry.path,
                            entry.is_dir(follow_symlinks=False),
                            entry.is_symlink(),
                            info.st_size,
                            info.st_mtime_ns,
                        )
                    )
        except FileNotFoundError:
            return []
        return sorted(found, key=lambda e: e.name)

    def open_read(self, location: str) -> IO[bytes]:
        descriptor = os.open(location, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        handle = os.fdopen(descriptor, "rb")
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            handle.close()
            raise OSError(f"{Path(location).name} is not a regular file")
        return handle

    def exists(self, location: str) -> bool:
        return os.path.lexists(location)

    def write_bytes(self, location: str, data: bytes) -> None:
        path = Path(location)
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        scratch.write_bytes(data)
        os.replace(scratch, path)

    def move(self, source: str, target: str) -> None:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)

    def remove(self, location: str) -> None:
        Path(location).unlink(missing_ok=True)

    def remove_tree(self, location: str) -> None:
        shutil.rmtree(location, ignore_errors=True)

    def join(self, location: str, *parts: str) -> str:
        return str(Path(location, *parts))


def s3_filesystem(environ: Mapping[str, str] | None = None) -> object:
    """pyarrow's S3 file system from the AWS environment variables (the ones delta-rs reads)."""
    from pyarrow import fs

    env = os.environ if environ is None else environ
    endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "").strip()
    options: dict[str, object] = {}
    if endpoint:
        parts = urlsplit(endpoint)
        options["endpoint_override"] = parts.netloc
        options["scheme"] = parts.scheme or "https"
        options["force_virtual_addressing"] = env.get(
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST", ""
        ).strip().lower() in {"1", "true"}
    region = (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "").strip()
    if region:
        options["region"] = region
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        options["access_key"] = env["AWS_ACCESS_KEY_ID"]
        options["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            options["session_token"] = env["AWS_SESSION_TOKEN"]
    return fs.S3FileSystem(**options)


class S3Store:
    """`s3://bucket/key` locations through pyarrow's S3 client."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.fs = s3_filesystem(environ)

    @staticmethod
    def _key(location: str) -> str:
        parts = urlsplit(location)
        return f"{parts.netloc}{parts.path}".rstrip("/")

    def list_dir(self, location: str) -> list[Entry]:
        from pyarrow import fs

        selector = fs.FileSelector(self._key(location), allow_not_found=True, recursive=False)
        found = []
        for info in self.fs.get_file_info(selector):  # type: ignore[attr-defined]
            mtime = info.mtime_ns or 0
            found.append(
                Entry(
                    info.base_name,
                    f"s3://{info.path}",
                    info.type == fs.FileType.Directory,
                    False,
                    int(info.size or 0),
                    int(mtime),
                )
            )
        return sorted(found, key=lambda e: e.name)

    def open_read(self, location: str) -> IO[bytes]:
        return self.fs.open_input_stream(self._key(location))  # type: ignore[attr-defined,no-any-return]

    def exists(self, location: str) -> bool:
        from pyarrow import fs

        info = self.fs.get_file_info(self._key(location))  # type: ignore[attr-defined]
        return bool(info.type != fs.FileType.NotFound)

    def write_bytes(self, location: str, data: bytes) -> None:
        with self.fs.open_output_stream(self._key(location)) as out:  # type: ignore[attr-defined]
            out.write(data)  # one PUT: readers see the old object or the new one

    def move(self, source: str, target: str) -> None:
        # No rename on S3: a server-side copy, then the delete.
        self.fs.copy_file(self._key(source), self._key(target))  # type: ignore[attr-defined]
        self.fs.delete_file(self._key(source))  # type: ignore[attr-defined]

    def remove(self, location: str) -> None:
        if self.exists(location):
            self.fs.delete_file(self._key(location))  # type: ignore[attr-defined]

    def remove_tree(self, location: str) -> None:
        from pyarrow import fs

        info = self.fs.get_file_info(self._key(location))  # type: ignore[attr-defined]
        if info.type == fs.FileType.Directory:
            self.fs.delete_dir(self._key(location))  # type: ignore[attr-defined]

    def join(self, location: str, *parts: str) -> str:
        return "/".join([location.rstrip("/"), *parts])


def store_for(location: str) -> Store:
    """The store of `location`: S3 for `s3://`/`s3a://` URIs, else the local file system."""
    if urlsplit(location).scheme.lower() in {"s3", "s3a"}:
        return S3Store()
    return LocalStore()


def walk_files(store: Store, location: str) -> Iterator[Entry]:
    """Every file under `location`, depth first, by name (links reported, never followed)."""
    for entry in store.list_dir(location):
        if entry.is_dir and not entry.is_link:
            yield from walk_files(store, entry.location)
        else:
            yield entry
