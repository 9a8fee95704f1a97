"""Durations written as text in the config table (`30m`, `2h`, `1h30m`, `1d`) as timedeltas."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_PART = re.compile(r"(\d+)([smhdw])")
_WHOLE = re.compile(r"^(?:\d+[smhdw])+$")
DURATION_HELP = "a duration such as 45s, 30m, 2h, 1h30m or 1d (units s, m, h, d, w)"


def parse_duration(text: str) -> timedelta:
    """`1h30m` -> timedelta(hours=1, minutes=30); ValueError naming the text otherwise.

    Each unit appears at most once, largest first, so that a value reads one way only.
    """
    compact = text.strip().lower() if isinstance(text, str) else ""
    if not _WHOLE.match(compact):
        raise ValueError(f"{text!r} is not {DURATION_HELP}")
    parts = _PART.findall(compact)
    units = [unit for _, unit in parts]
    order = list(_UNITS)
    if len(set(units)) != len(units) or units != sorted(units, key=order.index, reverse=True):
        raise ValueError(f"{text!r}: give each unit once, largest first (like 1h30m)")
    value = timedelta(**{_UNITS[unit]: int(number) for number, unit in parts})
    if value <= timedelta(0):
        raise ValueError(f"{text!r} must be longer than zero")
    return value


def format_duration(value: timedelta) -> str:
    """The shortest text parse_duration reads back as `value` (whole seconds), e.g. `1h30m`."""
    seconds = int(value.total_seconds())
    if seconds <= 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
