"""The wording of config problems: a pydantic error in the project's words, and the near misses.

A problem says what is wrong and what would be right, in the words of the README (pydantic
would quote a regex or name its error type).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# What a pattern means, in the words of the README (pydantic would quote the regex).
PATTERN_HELP = {
    NAME_PATTERN: "must be lower-case letters, digits and _, starting with a letter (e.g. orders_v2)",
    COLUMN_PATTERN: "must be letters, digits and _, not starting with a digit (e.g. CREATE_DATE)",
}
# What a value of the wrong kind should have been, by pydantic's error type.
EXPECTED = {
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "string_type": "text",
    "list_type": "a list such as [A, B]",
    "dict_type": "a mapping such as {ID: bigint}",
    "date_parsing": "a date such as 2024-01-01",
    "date_from_datetime_parsing": "a date such as 2024-01-01",
    "date_type": "a date such as 2024-01-01",
}


def close(value: object, choices: Iterable[str]) -> str:
    """'; did you mean `x`?' when `value` is close to one of `choices`, else ''."""
    matches = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.6)
    return f"; did you mean `{matches[0]}`?" if matches else ""


def describe(error: Mapping[str, Any]) -> str:
    """A pydantic error (an item of `ValidationError.errors()`) in the project's words."""
    kind, given, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch":
        pattern = ctx.get("pattern", "")
        return f"{given!r} {PATTERN_HELP.get(pattern, f'must match {pattern}')}"
    if kind in ("literal_error", "enum"):
        options = [o.strip().strip("'") for o in re.split(r",| or ", ctx.get("expected", ""))]
        options = [o for o in options if o]
        return f"{given!r} is not one of {', '.join(options)}{close(given, options)}"
    if kind == "too_short":
        if ctx.get("min_length") == 1:
            return "must not be empty (name at least one)"
        return f"needs at least {ctx.get('min_length')} items"
    if kind in ("greater_than_equal", "greater_than"):
        return f"{given!r} is too small (at least {ctx.get('ge', ctx.get('gt'))})"
    if kind in ("less_than_equal", "less_than"):
        return f"{given!r} is too large (at most {ctx.get('le', ctx.get('lt'))})"
    if kind in EXPECTED:
        return f"{given!r} is not {EXPECTED[kind]}"
    # Our own validators raise ValueError with the whole message already in our words.
    return str(error["msg"]).removeprefix("Value error, ")
