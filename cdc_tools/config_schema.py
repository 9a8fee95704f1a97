"""config/tables.schema.json, the config table's JSON Schema, generated from the config model.

Editors that read JSON Schema for YAML (the YAML language server: VS Code, JetBrains, Neovim)
complete the fields and underline a misspelt key or a wrong type as it is typed, once the file
names the schema in its first line:

    # yaml-language-server: $schema=tables.schema.json

The row schema is pydantic's own (`TableConfig.model_json_schema()`, the input it accepts:
every field's type, pattern, enum, default and description), with one change: a row must name
only `name`, because `defaults:` and a row's change format may fill in the other fields the
model requires. The cross-field rules are `cdc validate`'s. `tests/unit/test_config_schema.py`
regenerates the file and fails when the committed one differs.

    python -m cdc_tools.config_schema --write
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cdc_pipeline.config import TableConfig, project_root

SCHEMA_PATH = Path("config") / "tables.schema.json"
META_SCHEMA = "https://json-schema.org/draft/2020-12/schema"


def row_schema() -> dict[str, Any]:
    """One row of `tables:`: the model's fields, `name` the only one a row must set."""
    schema = TableConfig.model_json_schema(mode="validation")
    schema.pop("$defs", None)
    schema["required"] = ["name"]
    return schema


def defaults_schema(row: dict[str, Any]) -> dict[str, Any]:
    """`defaults:`: any row field, none required, applied to every row."""
    return {
        "title": "Defaults",
        "description": "Any field of a table row, for every row (a row's own value wins).",
        "type": "object",
        "additionalProperties": False,
        "properties": row["properties"],
    }


def schema() -> dict[str, Any]:
    """The whole config file's schema."""
    row = row_schema()
    definitions = TableConfig.model_json_schema(mode="validation").get("$defs", {})
    return {
        "$schema": META_SCHEMA,
        "title": "CDC config table",
        "description": (
            "One row per source table (generated from cdc_pipeline.config.TableConfig by "
            "cdc_tools/config_schema.py: do not edit). `cdc validate` checks the rules "
            "between fields too."
        ),
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "defaults": {"$ref": "#/$defs/Defaults"},
            "tables": {
                "description": "The table rows: adding a row adds a table and its DAG.",
                "type": "array",
                "items": {"$ref": "#/$defs/TableConfig"},
            },
        },
        "$defs": {**definitions, "TableConfig": row, "Defaults": defaults_schema(row)},
    }


def render() -> str:
    """The schema file's text: indented JSON, keys in the model's order, a final newline."""
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the schema, or with --write replace config/tables.schema.json in the project."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help=f"write {SCHEMA_PATH} instead of printing it"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        target = project_root() / SCHEMA_PATH
        target.write_text(text)
        print(f"wrote {target}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
