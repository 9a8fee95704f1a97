"""flat (and snapshot) JSON lines: the object is the row image; its flag column says I, U or D."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_pipeline.config import TableConfig
from spark_jobs.formats.json_lines import TOO_DEEP, change_struct, classified, image_at, too_deep


def parse_flat(table: TableConfig, v: Column) -> tuple[Column, Column, Column, dict[str, Column]]:
    is_object = F.coalesce(F.schema_of_variant(v).startswith("OBJECT"), F.lit(False))
    # A Kafka message with a null value (a tombstone, for log compaction) is no change.
    tombstone = [(F.is_variant_null(v), "tombstone")] if table.source == "kafka" else []
    kind = classified([*tombstone, (v.isNull() | ~is_object, "malformed")], "event")
    error = F.when(too_deep(v), F.lit(TOO_DEEP)).when(
        kind == "malformed", F.lit("malformed line: not a JSON object")
    )
    image = image_at(v, "$")
    flag = F.variant_get(image[table.flag_column], "$", "string")
    changes = F.array(change_struct(flag, image, F.lit(None).cast("map<string,string>")))
    return kind, error, changes, {}
