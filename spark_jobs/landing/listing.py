"""An interval's part of a table's landing, listed without following links.

A link (file or folder) under a table's landing folder is never followed nor opened: it is refused
and reported. Folders and files the layout does not name (bad dt=/hr= names, files outside hour
folders, other extensions) are reported once per run; only the table folder's top level, the
interval's dt= folders and its hour folders are looked at."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from cdc_pipeline.errors import InputError
from cdc_pipeline.intervals import HourBatch, Interval, batch_id
from cdc_pipeline.paths import Location, TablePaths
from spark_jobs.landing.versions import (
    EXTENSIONS,
    SYMLINK_REASON,
    LandingFile,
    Refusal,
    is_reserved_name,
)
from spark_jobs.runtime.storage import Entry, Store, is_local, store_for

_DAY = re.compile(r"^dt=(\d{4}-\d{2}-\d{2})$")

_HOUR = re.compile(r"^hr=([01]\d|2[0-3])$")

# Hadoop reads a path with these characters as a glob pattern (a[1].json would match a1.json):
# each is escaped with a backslash before Spark gets the path, so a name is read as exactly that
# file (Hadoop's GlobPattern treats `\\x` as the literal x).
_GLOB_CHARACTERS = set("\\[]{}*?")


def spark_path(path: Location) -> str:
    """The path to hand to Spark's readers: glob characters escaped, so it names one file."""
    return "".join(f"\\{c}" if c in _GLOB_CHARACTERS else c for c in str(path))


@dataclass
class Listing:
    """What the interval's part of a table's landing holds."""

    files: list[LandingFile] = field(default_factory=list)  # change files, in arrival order
    links: list[Refusal] = field(default_factory=list)  # links on the interval's paths
    unrecognised: list[str] = field(default_factory=list)  # entries the layout does not name


def _scan(store: Store, folder: Location) -> list[Entry]:
    # Hidden and `_` names (`.crc`, `_SUCCESS`, editors' temp files) are skipped, as Spark does.
    return [e for e in store.list_dir(folder) if not e.name.startswith((".", "_"))]


def _day(name: str) -> date | None:
    match = _DAY.match(name)
    if not match:
        return None
    try:
        return date.fromisoformat(match.group(1))
    except ValueError:
        return None


def list_landing(paths: TablePaths, interval: Interval, file_format: str) -> Listing:
    """The interval's change files, refused links and unrecognised entries; nothing is followed.

    Raises InputError when the table's landing folder itself is a link.
    """
    root = paths.landing
    listing = Listing()
    store = store_for(root)
    found = store.info(root)
    if found is not None and found.is_link:
        raise InputError(
            f"table {paths.name}: the landing folder {root} is a symbolic link; landing links are "
            "never followed: make it a real folder"
        )
    if found is None or not found.is_dir:
        return listing
    hours = {h.batch_id: h for h in interval.hours()}
    days: dict[date, list[str]] = {}
    for batch in sorted(hours):
        days.setdefault(hours[batch].start.date(), []).append(batch)
    day_folders = _day_folders(store, root, days, listing)
    hour_folders = _hour_folders(store, day_folders, hours, listing)
    _list_files(store, hour_folders, file_format, listing)
    return listing


def _day_folders(
    store: Store, root: Location, days: dict[date, list[str]], listing: Listing
) -> list[Entry]:
    """The interval's dt= folders; links (reported under the day's hour 00) and unrecognised
    entries go to the listing."""
    day_folders = []
    for entry in _scan(store, root):
        day = _day(entry.name)
        if entry.is_link:
            if day in days:
                # The day's hour 00 holds the report (quarantine is by hour), whatever the interval.
                batch = batch_id(day.isoformat(), "00")
                listing.links.append(Refusal(batch, entry.name, entry.name, SYMLINK_REASON))
            elif day is None:
                listing.unrecognised.append(f"{entry.name} (symbolic link)")
        elif day is None or not entry.is_dir:
            suffix = "/" if entry.is_dir else ""
            listing.unrecognised.append(entry.name + suffix)
        elif day in days:
            day_folders.append(entry)
    return day_folders


def _hour_folders(
    store: Store, day_folders: list[Entry], hours: dict[str, HourBatch], listing: Listing
) -> list[tuple[str, str, Location]]:
    """(batch, relative folder, folder) of the interval's hr= folders in the day folders; links
    and unrecognised entries go to the listing."""
    hour_folders = []
    for day_entry in day_folders:
        for entry in _scan(store, day_entry.location):
            relative = f"{day_entry.name}/{entry.name}"
            hour = _HOUR.match(entry.name)
            if hour is None or not (entry.is_dir or entry.is_link):
                suffix = "/" if entry.is_dir else ""
                listing.unrecognised.append(relative + suffix)
                continue
            batch = batch_id(day_entry.name[3:], hour.group(1))
            if batch not in hours:
                continue  # another interval's hour
            elif entry.is_link:
                listing.links.append(Refusal(batch, relative, relative, SYMLINK_REASON))
            else:
                hour_folders.append((batch, relative, entry.location))
    return hour_folders


def _list_files(
    store: Store, hour_folders: list[tuple[str, str, Location]], file_format: str, listing: Listing
) -> None:
    """The change files of the hour folders into the listing; links and other entries refused."""
    extensions = EXTENSIONS[file_format]
    for batch, folder_relative, folder in hour_folders:
        for entry in _scan(store, folder):
            relative = f"{folder_relative}/{entry.name}"
            if entry.is_link:
                listing.links.append(Refusal(batch, entry.name, relative, SYMLINK_REASON))
                continue
            if (
                not entry.is_file()
                or not entry.name.lower().endswith(extensions)
                or is_reserved_name(entry.name)
            ):
                suffix = "/" if entry.is_dir else ""
                listing.unrecognised.append(relative + suffix)
                continue
            listing.files.append(
                LandingFile(batch, entry.location, relative, entry.size, entry.mtime_ns or 0)
            )


def listing_interval(
    interval: Interval, window: timedelta, *, whole_extracts: bool = False
) -> Interval:
    """The hours a stage run over `interval` lists: every hour folder that starts in
    [end - window, end), and the interval's own hours when it is longer than the window.
    A full-extract table (`whole_extracts`) reads only its interval's own hours."""
    if whole_extracts:
        return interval
    return Interval(min(interval.start, interval.end - window), interval.end)


def _hour_of(day_name: str, hour_name: str, before: datetime) -> str | None:
    """The batch of a dt=/hr= folder pair that starts before `before` (None: not such a folder)."""
    day = _day(day_name)
    hour = _HOUR.match(hour_name)
    if day is None or hour is None:
        return None
    start = datetime(day.year, day.month, day.day, int(hour.group(1)), tzinfo=UTC)
    return batch_id(day_name[3:], hour.group(1)) if start < before else None


def hour_files_before(
    store: Store, root: Location, before: datetime, seen: dict[str, int]
) -> Iterable[tuple[str, str, list[Entry]]]:
    """(batch, relative folder, entries) of every hour folder that starts before `before`.

    On a local file system a folder whose mtime is not after `seen[batch]` is not opened; object
    storage has no folder times, so the table's landing is listed once, recursively (one
    paginated listing instead of one request per hour folder)."""
    if not is_local(root):
        grouped: dict[tuple[str, str], list[Entry]] = {}
        for entry in store.walk(root):
            parts = str(entry.location)[len(str(root)) + 1 :].split("/")
            if len(parts) == 3:
                grouped.setdefault((parts[0], parts[1]), []).append(entry)
        for (day_name, hour_name), entries in sorted(grouped.items()):
            batch = _hour_of(day_name, hour_name, before)
            if batch is not None:
                yield batch, f"{day_name}/{hour_name}", sorted(entries, key=lambda e: e.name)
        return
    for day_entry in _scan(store, root):
        day = _day(day_entry.name)
        if day is None or day > before.date() or not day_entry.is_dir:
            continue
        for hour_entry in _scan(store, day_entry.location):
            batch = _hour_of(day_entry.name, hour_entry.name, before)
            if batch is None or not hour_entry.is_dir:
                continue
            if (hour_entry.mtime_ns or 0) <= seen.get(batch, -1):
                continue
            relative_folder = f"{day_entry.name}/{hour_entry.name}"
            yield batch, relative_folder, store.list_dir(hour_entry.location)
