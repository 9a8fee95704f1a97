"""A small pure-Python model of the latest-change rule, for the property-based differential test.

It knows nothing of the engine (no Spark, no `spark_jobs`): it is handed the changes as they
were landed (values as written to the file, plus the arrival: hour folder, file name, row
position) and answers with the rows the final table must hold.

The rule, from the README: within a key the change with the greatest `sequence_by` values wins;
exact ties go to the later arrival (hour folder, then file name, then row in the file). A winning
`D` (flags are case-insensitive) removes the key. The partition column is computed from the
winning row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Row = Mapping[str, Any]
Key = tuple[Any, ...]


@dataclass(frozen=True)
class Landed:
    """One change row as landed: its values as written, and where it arrived."""

    batch: str  # hour folder as 'YYYY-MM-DDTHH', which sorts in arrival order
    file: str
    position: int
    values: Row

    @property
    def arrival(self) -> tuple[str, str, int]:
        return (self.batch, self.file, self.position)


def typed(value: Any, spark_type: str) -> Any:
    """A written value read as the declared Spark SQL type (only the types the test uses)."""
    if value is None:
        return None
    if spark_type in ("int", "bigint"):
        return int(value)
    if spark_type == "string":
        return str(value)
    if spark_type == "timestamp":
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)
    raise ValueError(f"the model does not know the type {spark_type}")


@dataclass(frozen=True)
class TableModel:
    """What a config row means to the model."""

    columns: Mapping[str, str]
    keys: tuple[str, ...]
    sequence_by: tuple[str, ...]
    partition_column: str | None = None
    partition: Callable[[Row], Any] | None = field(default=None, compare=False)
    flag_column: str = "FLAG"

    @property
    def output_columns(self) -> list[str]:
        """Columns of a final row: the data columns, then the partition column."""
        partition = [self.partition_column] if self.partition_column else []
        return [*self.columns, *partition]

    def typed_row(self, change: Landed) -> dict[str, Any]:
        return {c: typed(change.values.get(c), t) for c, t in self.columns.items()}

    def flag(self, change: Landed) -> str:
        return str(change.values[self.flag_column]).strip().upper()

    def rank(self, change: Landed) -> tuple[Any, ...]:
        """Greater wins: the sequence values, then the arrival."""
        row = self.typed_row(change)
        return (tuple(row[c] for c in self.sequence_by), change.arrival)

    def winners(self, changes: Iterable[Landed]) -> dict[Key, Landed]:
        """key -> the winning change of the key (a D included)."""
        best: dict[Key, Landed] = {}
        for change in changes:
            row = self.typed_row(change)
            key = tuple(row[k] for k in self.keys)
            if key not in best or self.rank(change) > self.rank(best[key]):
                best[key] = change
        return best

    def final(self, changes: Iterable[Landed]) -> dict[Key, tuple[Any, ...]]:
        """key -> the final row (output_columns) of every key whose winning change is not a D."""
        result: dict[Key, tuple[Any, ...]] = {}
        for key, change in self.winners(changes).items():
            if self.flag(change) == "D":
                continue
            row = self.typed_row(change)
            if self.partition_column is not None:
                assert self.partition is not None
                row[self.partition_column] = self.partition(row)
            result[key] = tuple(row[c] for c in self.output_columns)
        return result

    def history(self, changes: Iterable[Landed]) -> list[tuple[Any, ...]]:
        """SCD type 2 versions: output_columns + (valid_from, valid_to, is_current, is_deleted).

        Per key, in rank order: a change whose non-key, non-sequence values differ from the open
        version's opens a new version (closing the open one at its first sequence value); an
        equal one updates the open version in place; a D closes the open version as deleted.
        """
        skipped = {*self.keys, *self.sequence_by}
        tracked = [c for c in self.columns if c not in skipped]
        by_key: dict[Key, list[Landed]] = {}
        for change in changes:
            row = self.typed_row(change)
            by_key.setdefault(tuple(row[k] for k in self.keys), []).append(change)
        versions: list[tuple[Any, ...]] = []
        for key_changes in by_key.values():
            open_version: dict[str, Any] | None = None
            for change in sorted(key_changes, key=self.rank):
                row = self.typed_row(change)
                start = row[self.sequence_by[0]]
                if self.flag(change) == "D":
                    if open_version is not None:
                        versions.append(self._version(open_version, start, False, True))
                    open_version = None
                    continue
                values = [row[c] for c in tracked]
                if open_version is not None and open_version["tracked"] == values:
                    open_version["row"] = row
                    continue
                if open_version is not None:
                    versions.append(self._version(open_version, start, False, False))
                open_version = {"row": row, "tracked": values, "from": start}
            if open_version is not None:
                versions.append(self._version(open_version, None, True, False))
        return sorted(versions, key=repr)

    def _version(
        self, version: dict[str, Any], until: Any, current: bool, deleted: bool
    ) -> tuple[Any, ...]:
        row = dict(version["row"])
        if self.partition_column is not None:
            assert self.partition is not None
            row[self.partition_column] = self.partition(row)
        return (*[row[c] for c in self.output_columns], version["from"], until, current, deleted)
