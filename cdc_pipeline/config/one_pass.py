"""One pass over a row: pydantic validates each field once, and the rules run on the rest.

Pydantic stops before the model's rules when a field fails. `cdc validate` must report every
problem of a row in one run, so `check_row` validates with a `RowCheck` in the validation
context: a field that fails is then recorded and kept as `Failed`, and the rules run once on
the others (a rule reading a failed field is skipped: that field has its own problem). Without
a `RowCheck` (`TableConfig(...)`, `model_validate`), validation raises as usual.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationInfo

from cdc_pipeline.config.messages import describe

# (field, message): one problem of one row.
Problem = tuple[str, str]
MISSING = "required field is missing"


@dataclass(frozen=True)
class Failed:
    """The value of a field that did not validate, as given (None when it is missing)."""

    given: Any = None


@dataclass
class RowCheck:
    """The problems of one row, collected during its validation."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    rules: list[Problem] = field(default_factory=list)

    CONTEXT_KEY = "row_check"

    @property
    def context(self) -> dict[str, Any]:
        """The validation context that puts pydantic in one-pass mode for this row."""
        return {self.CONTEXT_KEY: self}

    @classmethod
    def of(cls, info: ValidationInfo) -> RowCheck | None:
        """The RowCheck of this validation, or None outside `check_row`."""
        context = info.context
        return context.get(cls.CONTEXT_KEY) if isinstance(context, Mapping) else None

    def field_failed(self, name: str, errors: Iterable[Mapping[str, Any]]) -> None:
        """Record a field's pydantic errors, in the project's words."""
        self.fields.setdefault(name, []).extend(describe(error) for error in errors)

    def field_missing(self, name: str) -> None:
        """Record a required field the row does not set."""
        self.fields.setdefault(name, []).append(MISSING)

    def field_problems(self, order: Iterable[str]) -> list[Problem]:
        """The field problems in the model's field order (the order of the reference page)."""
        return [(name, message) for name in order for message in self.fields.get(name, [])]
