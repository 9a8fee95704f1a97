"""What a table's quarantine holds, read without Spark: rows per hour batch and reason, and
sample rows with the values refused and where they came from (batch, file, row).

`cdc quarantine TABLE` prints it and the CDC tables view's drill-down page shows it: the
engineer sees which rule refused what, since when, and the exact source line to fix, like the
sample failing rows of an expectation in Databricks' pipeline UI. Only the newest `batches`
hour folders are read for samples; the counts read two short columns of the whole table.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cdc_pipeline.columns import BATCH, FILE, RAW, REASON, ROW, TECHNICAL_PREFIX
from cdc_pipeline.paths import Location
from spark_jobs import delta

DEFAULT_BATCHES = 24
DEFAULT_SAMPLES = 20
VALUE_CHARS = 200  # a value longer than this is cut in the sample (with its length)


@dataclass(frozen=True, kw_only=True)
class QuarantinedRow:
    """One quarantined row: why, where from, and the values it had (as read, text)."""

    batch: str
    file: str | None
    row: int | None
    reason: str
    values: dict[str, str | None]
    raw: str | None = None  # the raw line or CSV row, when the row could not be split

    def where(self) -> str:
        """`hour 2024-01-01T00, file a.csv, _cdc_row 3` (the row's `_cdc_row`: its data row or
        line in the file counted from 0, a Kafka message's offset)."""
        row = "" if self.row is None else f", {ROW} {self.row}"
        return f"hour {self.batch}, file {self.file or '?'}{row}"

    def shown_values(self) -> str:
        """`ID=null, VALUE='2'`: each value quoted, long ones cut; the raw line if any."""
        parts = [f"{name}={_shown(value)}" for name, value in self.values.items()]
        if self.raw is not None:
            parts.append(f"raw={_shown(self.raw)}")
        return ", ".join(parts)

    def document(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "file": self.file,
            "row": self.row,
            "reason": self.reason,
            "values": self.values,
            "raw": self.raw,
        }


@dataclass(frozen=True, kw_only=True)
class QuarantineReport:
    """A table's quarantine: rows held, counts per (batch, reason) newest batch first, samples."""

    table: str
    total: int = 0
    counts: list[tuple[str, str, int]] = field(default_factory=list)
    samples: list[QuarantinedRow] = field(default_factory=list)
    batches_read: int = 0  # of the newest batches, read for samples

    def by_reason(self) -> list[tuple[str, int]]:
        """Rows held per reason, most first."""
        totals: Counter[str] = Counter()
        for _, reason, rows in self.counts:
            totals[reason] += rows
        return totals.most_common()

    def document(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "rows": self.total,
            "by_reason": [{"reason": r, "rows": n} for r, n in self.by_reason()],
            "by_batch": [{"batch": b, "reason": r, "rows": n} for b, r, n in self.counts],
            "samples": [s.document() for s in self.samples],
        }

    def lines(self) -> list[str]:
        """What `cdc quarantine` prints: the totals, the counts per hour, the samples."""
        if not self.total:
            return [f"quarantine {self.table}: rows=0"]
        out = [f"quarantine {self.table}: rows={self.total} reasons={len(self.by_reason())}"]
        out += [f"  {rows} x {reason}" for reason, rows in self.by_reason()]
        out.append(f"quarantine {self.table}: per hour, newest first:")
        out += [f"  {batch}: {rows} x {reason}" for batch, reason, rows in self.counts]
        out.append(
            f"quarantine {self.table}: {len(self.samples)} sample row(s) of the newest "
            f"{self.batches_read} hour(s):"
        )
        for sample in self.samples:
            out.append(f"  {sample.where()}: {sample.reason}: {sample.shown_values()}")
        return out


def _shown(value: str | None) -> str:
    if value is None:
        return "null"
    if len(value) > VALUE_CHARS:
        return repr(value[:VALUE_CHARS]) + f"... ({len(value)} chars)"
    return repr(value)


def quarantine_report(
    table: str,
    path: Location,
    *,
    batches: int = DEFAULT_BATCHES,
    samples: int = DEFAULT_SAMPLES,
) -> QuarantineReport:
    """The quarantine at `path` (none yet: an empty report). A damaged table raises CdcError."""
    opened = delta.open_table(path)
    if opened is None:
        return QuarantineReport(table=table)
    names = {f.name for f in opened.schema().fields}
    if BATCH not in names:  # a table written before batches were kept: counts by reason only
        keys = [{BATCH: "?", **r} for r in opened.to_pyarrow_table(columns=[REASON]).to_pylist()]
    else:
        keys = opened.to_pyarrow_table(columns=[BATCH, REASON]).to_pylist()
    counted = Counter((str(row[BATCH]), str(row[REASON])) for row in keys)
    counts = sorted((b, r, n) for (b, r), n in counted.items())
    counts.sort(key=lambda item: (-item[2], item[1]))  # most rows first, then by reason
    counts.sort(key=lambda item: item[0], reverse=True)  # newest hour first
    newest = sorted({batch for batch, _ in counted}, reverse=True)[:batches]
    return QuarantineReport(
        table=table,
        total=len(keys),
        counts=counts,
        samples=_samples(opened, newest, samples) if samples > 0 else [],
        batches_read=len(newest),
    )


def _samples(opened: Any, newest: list[str], limit: int) -> list[QuarantinedRow]:
    """The first `limit` rows of the `newest` batches, newest batch first, then by file and row
    (only those batches' files are read when the table is partitioned by batch)."""
    if not newest:
        return []
    partitioned = BATCH in opened.metadata().partition_columns
    rows = (
        opened.to_pyarrow_table(filters=[(BATCH, "in", newest)])
        if partitioned
        else opened.to_pyarrow_table()
    ).to_pylist()
    rows = [r for r in rows if str(r.get(BATCH, "?")) in newest]
    rows.sort(key=lambda r: (r.get(FILE) or "", r.get(ROW) or 0))
    rows.sort(key=lambda r: str(r.get(BATCH, "?")), reverse=True)
    return [
        QuarantinedRow(
            batch=str(row.get(BATCH, "?")),
            file=row.get(FILE),
            row=row.get(ROW),
            reason=str(row[REASON]),
            values={k: _text(v) for k, v in row.items() if not k.startswith(TECHNICAL_PREFIX)},
            raw=_text(row.get(RAW)),
        )
        for row in rows[:limit]
    ]


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
