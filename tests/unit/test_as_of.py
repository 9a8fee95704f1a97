"""`cdc as-of --at`: read as the type of the column that bounds the history's versions."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from pyspark.sql.types import (
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from cdc_pipeline.errors import UsageError
from spark_jobs.as_of import at_value


def test_at_is_read_as_the_sequence_type() -> None:
    moment = datetime(2024, 1, 1, 0, 30, tzinfo=UTC)
    assert at_value("2024-01-01T00:30:00Z", TimestampType(), "TS") == moment
    assert at_value("2024-01-01T00:30:00Z", TimestampNTZType(), "TS") == moment.replace(tzinfo=None)
    assert at_value("2024-01-02", DateType(), "D") == date(2024, 1, 2)
    assert at_value("3", IntegerType(), "TIME") == 3
    assert at_value("1.50", DecimalType(10, 2), "N") == Decimal("1.50")
    assert at_value("0/16B3748", StringType(), "_cdc_position") == "0/16B3748"
    # Debezium's source time is epoch milliseconds: an ISO timestamp is converted.
    assert at_value("2024-01-01T00:00:01Z", LongType(), "_cdc_source_ts_ms") == 1704067201000
    with pytest.raises(UsageError, match=r"--at '2024-01-01': the history's versions are bounded"):
        at_value("2024-01-01", LongType(), "SEQ")
