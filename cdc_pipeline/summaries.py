"""What a `cdc` command reports as data, for `--json`: each step records its summary here."""

from __future__ import annotations

from typing import Any

_recorded: dict[str, Any] = {}


def record(key: str, value: Any) -> None:
    """Record one part of the running command's summary (a later value of `key` replaces it)."""
    _recorded[key] = value


def take() -> dict[str, Any]:
    """Everything recorded since the last call (and forget it)."""
    taken = dict(_recorded)
    _recorded.clear()
    return taken
