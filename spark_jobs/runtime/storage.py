"""The driver side's file system: one small adapter for a local (or mounted) folder and for
object storage (`s3://bucket/prefix`), so the steps list landing folders, read files, adopt
written files and clean up through one interface instead of `os`/`pathlib` calls.

`LocalStore` holds the calls the steps made before (`os.scandir`, `os.open` with `O_NOFOLLOW`,
`os.replace`), so the hostile-name and symlink behaviour stays what the tests pin; `S3Store` is
the same interface over `pyarrow.fs.S3FileSystem`, configured from the AWS environment variables
delta-rs and the Spark sessions read (spark_jobs/runtime/object_store.py).

What object storage does not have, and what the steps do instead:
- No links: nothing to refuse.
- No folder modification times: a folder's entries are listed (one paginated LIST per prefix)
  where a local folder's mtime would have said "unchanged since the last run".
- No rename: `move` is a server-side copy, then the delete. A file the steps adopt is written
  once, under a name nobody else uses, and is not in any commit yet: a crash between the two
  leaves an uncommitted copy, as a crash between Spark's write and the commit does anywhere;
  vacuum removes it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from cdc_pipeline.paths import Location, ObjectPath


@dataclass(frozen=True)
class Entry:
    """One entry of a folder listing (or one file's information)."""

    name: str
    location: Location
    is_dir: bool
    is_link: bool  # a symbolic link (never on object storage)
    size: int
    mtime_ns: int | None  # None: a folder in object storage (no such time there)

    def is_file(self) -> bool:
        """A regular file (not a folder, not a link)."""
        return not self.is_dir and not self.is_link


class Store(Protocol):
    """What the steps do with files on the driver side."""

    def list_dir(self, location: Location) -> list[Entry]:
        """The folder's entries, by name (a missing folder: an empty list)."""

    def walk(self, location: Location) -> Iterator[Entry]:
        """Every file under the folder (links reported, never followed), by location."""

    def info(self, location: Location) -> Entry | None:
        """The entry itself, never through a link (None when it does not exist)."""

    def open_read(self, location: Location) -> IO[bytes]:
        """A regular file's bytes (seekable), never through a link."""

    def read_text(self, location: Location) -> str | None:
        """A small file's text; None when it does not exist."""

    def write_bytes(self, location: Location, data: bytes) -> None:
        """The whole file, replaced at once for readers (parent folders made)."""

    def move(self, source: Location, target: Location) -> None:
        """`source` to `target` (parent folders made); replaces `target`."""

    def copy(self, source: Location, target: Location) -> None:
        """A file's copy at `target` (parent folders made); replaces `target`."""

    def remove(self, location: Location) -> None:
        """The file, if it exists."""

    def remove_tree(self, location: Location) -> None:
        """The folder and everything under it, if it exists."""

    def make_dirs(self, location: Location) -> None:
        """The folder and its parents (nothing to do in object storage)."""


def _local(location: Location) -> Path:
    if not isinstance(location, Path):
        raise TypeError(f"{location}: not a local path")
    return location


class LocalStore:
    """A local or mounted folder: os calls, links never followed."""

    def _entry(self, entry: os.DirEntry[str]) -> Entry:
        info = entry.stat(follow_symlinks=False)
        return Entry(
            entry.name,
            Path(entry.path),
            entry.is_dir(follow_symlinks=False),
            entry.is_symlink(),
            info.st_size,
            info.st_mtime_ns,
        )

    def list_dir(self, location: Location) -> list[Entry]:
        try:
            with os.scandir(_local(location)) as entries:
                found = [self._entry(e) for e in entries]
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(found, key=lambda e: e.name)

    def walk(self, location: Location) -> Iterator[Entry]:
        for entry in self.list_dir(location):
            if entry.is_dir and not entry.is_link:
                yield from self.walk(entry.location)
            else:
                yield entry

    def info(self, location: Location) -> Entry | None:
        path = _local(location)
        try:
            found = os.lstat(path)
        except OSError:
            return None
        return Entry(
            path.name,
            path,
            stat.S_ISDIR(found.st_mode),
            stat.S_ISLNK(found.st_mode),
            found.st_size,
            found.st_mtime_ns,
        )

    def open_read(self, location: Location) -> IO[bytes]:
        path = _local(location)
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        handle = os.fdopen(descriptor, "rb")
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            handle.close()
            raise OSError(f"{path.name} is not a regular file")
        return handle

    def read_text(self, location: Location) -> str | None:
        try:
            return _local(location).read_text()
        except FileNotFoundError:
            return None

    def write_bytes(self, location: Location, data: bytes) -> None:
        path = _local(location)
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        scratch.write_bytes(data)
        os.replace(scratch, path)

    def move(self, source: Location, target: Location) -> None:
        _local(target).parent.mkdir(parents=True, exist_ok=True)
        os.replace(_local(source), _local(target))

    def copy(self, source: Location, target: Location) -> None:
        _local(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_local(source), _local(target), follow_symlinks=False)

    def remove(self, location: Location) -> None:
        _local(location).unlink(missing_ok=True)

    def remove_tree(self, location: Location) -> None:
        shutil.rmtree(_local(location), ignore_errors=True)

    def make_dirs(self, location: Location) -> None:
        _local(location).mkdir(parents=True, exist_ok=True)


def _s3_filesystem() -> object:
    """pyarrow's S3 file system from the AWS environment variables (the ones delta-rs reads)."""
    return _cached_s3_filesystem(_s3_settings())


def _s3_settings() -> tuple[str, ...]:
    env = os.environ
    return tuple(
        env.get(name, "")
        for name in (
            "AWS_ENDPOINT_URL_S3",
            "AWS_ENDPOINT_URL",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
        )
    )


@functools.lru_cache(maxsize=4)
def _cached_s3_filesystem(settings: tuple[str, ...]) -> object:
    from pyarrow import fs

    return fs.S3FileSystem(**_s3_options(settings))


def _s3_options(settings: tuple[str, ...]) -> dict[str, object]:
    from urllib.parse import urlsplit

    endpoint_s3, endpoint, hosted, region, default_region, key, secret, token = settings
    options: dict[str, object] = {}
    endpoint = (endpoint_s3 or endpoint).strip()
    if endpoint:
        parts = urlsplit(endpoint)
        options["endpoint_override"] = parts.netloc
        options["scheme"] = parts.scheme or "https"
        options["force_virtual_addressing"] = hosted.strip().lower() in {"1", "true"}
    if (region or default_region).strip():
        options["region"] = (region or default_region).strip()
    if key and secret:
        options["access_key"] = key
        options["secret_key"] = secret
        if token:
            options["session_token"] = token
    return options


def _object(location: Location) -> ObjectPath:
    if not isinstance(location, ObjectPath):
        raise TypeError(f"{location}: not an s3:// location")
    return location


def _s3_key(location: Location) -> str:
    path = _object(location)
    return f"{path.bucket}/{path.key}".rstrip("/")


class _NativeRaw(io.RawIOBase):
    """A pyarrow NativeFile as Python's raw binary file."""

    def __init__(self, native: Any) -> None:
        self.native = native

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.native.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.native.seek(offset, whence))

    def tell(self) -> int:
        return int(self.native.tell())

    def close(self) -> None:
        if not self.closed:
            self.native.close()
        super().close()


class S3Store:
    """`s3://bucket/key` locations through pyarrow's S3 client."""

    def __init__(self) -> None:
        self.fs = _s3_filesystem()

    def _entry(self, info: object) -> Entry:
        from pyarrow import fs

        path: str = info.path  # type: ignore[attr-defined]
        bucket, _, key = path.partition("/")
        is_dir = info.type == fs.FileType.Directory  # type: ignore[attr-defined]
        mtime = info.mtime_ns  # type: ignore[attr-defined]
        return Entry(
            info.base_name,  # type: ignore[attr-defined]
            ObjectPath(bucket, key),
            is_dir,
            False,
            int(info.size or 0) if not is_dir else 0,  # type: ignore[attr-defined]
            None if is_dir or mtime is None else int(mtime),
        )

    def _listing(self, location: Location, *, recursive: bool) -> list[Entry]:
        from pyarrow import fs

        selector = fs.FileSelector(_s3_key(location), allow_not_found=True, recursive=recursive)
        infos = self.fs.get_file_info(selector)  # type: ignore[attr-defined]
        return [self._entry(i) for i in infos]

    def list_dir(self, location: Location) -> list[Entry]:
        return sorted(self._listing(location, recursive=False), key=lambda e: e.name)

    def walk(self, location: Location) -> Iterator[Entry]:
        files = [e for e in self._listing(location, recursive=True) if not e.is_dir]
        yield from sorted(files, key=lambda e: str(e.location))

    def info(self, location: Location) -> Entry | None:
        from pyarrow import fs

        found = self.fs.get_file_info(_s3_key(location))  # type: ignore[attr-defined]
        if found.type == fs.FileType.NotFound:
            return None
        return self._entry(found)

    def open_read(self, location: Location) -> IO[bytes]:
        native = self.fs.open_input_file(_s3_key(location))  # type: ignore[attr-defined]
        # A Python file (readline, iteration) over pyarrow's seekable ranged reads.
        return io.BufferedReader(_NativeRaw(native), buffer_size=1 << 20)

    def read_text(self, location: Location) -> str | None:
        try:
            with self.open_read(location) as handle:
                return handle.read().decode()
        except FileNotFoundError:
            return None

    def write_bytes(self, location: Location, data: bytes) -> None:
        with self.fs.open_output_stream(_s3_key(location)) as out:  # type: ignore[attr-defined]
            out.write(data)  # one PUT: readers see the old object or the new one

    def move(self, source: Location, target: Location) -> None:
        # No rename on S3: a server-side copy, then the delete.
        self.fs.copy_file(_s3_key(source), _s3_key(target))  # type: ignore[attr-defined]
        self.fs.delete_file(_s3_key(source))  # type: ignore[attr-defined]

    def copy(self, source: Location, target: Location) -> None:
        self.fs.copy_file(_s3_key(source), _s3_key(target))  # type: ignore[attr-defined]

    def remove(self, location: Location) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(_s3_key(location))  # type: ignore[attr-defined]

    def remove_tree(self, location: Location) -> None:
        entry = self.info(location)
        if entry is not None and entry.is_dir:
            self.fs.delete_dir(_s3_key(location))  # type: ignore[attr-defined]

    def make_dirs(self, location: Location) -> None:
        return None  # object storage has no folders to make


def store_for(location: Location) -> Store:
    """The store of `location`: S3 for an ObjectPath, else the local file system."""
    if isinstance(location, ObjectPath):
        return S3Store()
    return LocalStore()


def arrow_files(locations: list[Location]) -> tuple[Any, list[str]]:
    """(pyarrow file system, paths) to read these files with pyarrow's readers (datasets): the
    local file system (None) and the paths, or the S3 client and `bucket/key`s."""
    if locations and isinstance(locations[0], ObjectPath):
        return _s3_filesystem(), [_s3_key(location) for location in locations]
    return None, [str(location) for location in locations]


def is_local(location: Location) -> bool:
    """A folder on the local (or a mounted) file system."""
    return isinstance(location, Path)


def make_buckets(uris: list[str]) -> dict[str, bool]:
    """Create the buckets of these s3:// URIs where they do not exist yet (a deployment's first
    start: the compose file's init service). The steps themselves never create a bucket, so a
    mistyped name fails instead of writing where nobody reads. Returns bucket -> created."""
    from pyarrow import fs

    from cdc_pipeline.paths import as_location

    buckets: dict[str, bool] = {}
    for uri in uris:
        location = as_location(uri)
        if not isinstance(location, ObjectPath):
            raise ValueError(f"{uri}: not an s3:// URI (only object storage has buckets to make)")
        buckets[location.bucket] = False
    client = fs.S3FileSystem(**_s3_options(_s3_settings()), allow_bucket_creation=True)
    for bucket in buckets:
        if client.get_file_info(bucket).type == fs.FileType.NotFound:
            client.create_dir(bucket)
            buckets[bucket] = True
    return buckets


def main(argv: list[str] | None = None) -> int:
    """`python -m spark_jobs.runtime.storage --make-bucket URI...`: the buckets of the URIs exist
    after it (endpoint and keys from the AWS environment variables, as for the steps). Exit 2 on
    an error."""
    import argparse
    import sys

    from cdc_pipeline.errors import UsageError

    parser = argparse.ArgumentParser(prog="python -m spark_jobs.runtime.storage")
    parser.add_argument("--make-bucket", nargs="+", metavar="URI", required=True)
    args = parser.parse_args(argv)
    try:
        buckets = make_buckets(args.make_bucket)
    except (UsageError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for bucket, created in buckets.items():
        print(f"bucket {bucket}: {'created' if created else 'exists'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
