"""config/tables.schema.json is current, named by the sample config, and judges rows as the model does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from cdc_tools import config_schema

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "config" / "tables.yaml"


def validator() -> jsonschema.protocols.Validator:
    committed = json.loads((ROOT / config_schema.SCHEMA_PATH).read_text())
    cls = jsonschema.validators.validator_for(committed)
    cls.check_schema(committed)
    return cls(committed)


def errors(document: dict[str, Any]) -> list[str]:
    return [error.message for error in validator().iter_errors(document)]


def test_the_committed_schema_is_generated_from_the_current_model() -> None:
    committed = (ROOT / config_schema.SCHEMA_PATH).read_text()
    assert committed == config_schema.render(), (
        "config/tables.schema.json is stale: run `python -m cdc_tools.config_schema --write`"
    )


def test_the_sample_config_names_the_schema_and_is_valid_against_it() -> None:
    first_line = SAMPLE.read_text().splitlines()[0]
    assert first_line == "# yaml-language-server: $schema=tables.schema.json"
    assert errors(yaml.safe_load(SAMPLE.read_text())) == []


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"name": "t", "keyz": ["ID"]}, "Additional properties are not allowed ('keyz' was"),
        ({"name": "T"}, "'T' does not match '^[a-z][a-z0-9_]*$'"),
        ({"name": "t", "file_format": "xml"}, "'xml' is not one of ['parquet', 'csv', 'json']"),
        ({"name": "t", "keys": []}, "[] should be non-empty"),
        ({"keys": ["ID"]}, "'name' is a required property"),
    ],
)
def test_a_misspelt_key_or_a_wrong_value_is_an_error(row: dict[str, Any], message: str) -> None:
    assert any(found.startswith(message) for found in errors({"tables": [row]})), errors(
        {"tables": [row]}
    )


def test_defaults_take_any_row_field_and_no_unknown_key() -> None:
    assert errors({"defaults": {"schedule": "@daily"}, "tables": [{"name": "t"}]}) == []
    assert errors({"defaults": {"schedul": "@daily"}}) != []
    assert errors({"tables": [], "table": []}) != []
