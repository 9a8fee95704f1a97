"""The config file read into valid rows and problems, each problem at its `file:line`.

Validation is exactly as strict as what runs, and complete in one pass: each row is validated
once (its fields, then the rules on the fields that passed: see one_pass.py), duplicates are
found by name whatever the rows' validity, and one bad row hides no other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cdc_pipeline.config.document import Duplicate, LineMap, UnsafeYamlError, compose
from cdc_pipeline.config.formats import is_change_format, with_format_defaults
from cdc_pipeline.config.messages import close
from cdc_pipeline.config.model import TableConfig
from cdc_pipeline.config.one_pass import Failed, Problem, RowCheck
from cdc_pipeline.errors import ConfigError
from cdc_pipeline.paths import default_config_path, display_path

FIELDS = TableConfig.model_fields
# Where parse_config puts a problem: (table, field, message, line).
Report = Callable[[str, str, str, int | None], None]


@dataclass(frozen=True)
class ConfigProblem:
    """One validation problem of one config row: which table, which field, what is expected.

    With the file and line it comes from when known: `config/tables.yaml:12: table orders: ...`.
    """

    table: str
    field: str
    message: str
    line: int | None = None
    source: str | None = None

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}: " if self.source and self.line else ""
        return f"{where}table {self.table}: {self.field}: {self.message}"


@dataclass
class ConfigLoadResult:
    """The valid table rows and the problems of the invalid ones; one bad row hides no other."""

    tables: dict[str, TableConfig] = field(default_factory=dict)
    problems: list[ConfigProblem] = field(default_factory=list)

    def table(self, name: str) -> TableConfig:
        """The valid row called `name`, or a ConfigError explaining why there is none."""
        if name in self.tables:
            return self.tables[name]
        mine = [str(p) for p in self.problems if p.table == name]
        if mine:
            raise ConfigError("; ".join(mine))
        known = ", ".join(sorted(self.tables)) or "none"
        raise ConfigError(f"table {name}: not in the config table (valid tables: {known})")


def check_row(row: Mapping[str, Any]) -> tuple[list[Problem], TableConfig | None]:
    """Every (field, message) problem of one merged row in one pass, and the row when valid.

    In order: the field problems (in field order), unknown fields, then the broken rules.
    """
    unknown = [
        (
            str(key),
            f"unknown field{close(key, FIELDS) or ' (see README, The config table, for the fields)'}",
        )
        for key in row
        if key not in FIELDS
    ]
    data = with_format_defaults({key: value for key, value in row.items() if key in FIELDS})
    check = RowCheck()
    for name, info in FIELDS.items():
        if info.is_required() and name not in data:
            # Whether sequence_by is required depends on a change_format that did not parse.
            if name != "sequence_by" or is_change_format(data.get("change_format", "flat")):
                check.field_missing(name)
            data[name] = Failed()
    table = TableConfig.model_validate(data, context=check.context)
    problems = check.field_problems(FIELDS) + unknown + check.rules
    return (problems, None) if problems else ([], table)


def _line_of(lines: LineMap, index: int, field_name: str, *, from_row: bool) -> int | None:
    """The line of a row's field: where the row sets it, else where defaults do, else the row."""
    top = field_name.split(".")[0]
    if from_row and ("tables", index, top) in lines:
        return lines[("tables", index, top)]
    if ("defaults", top) in lines:
        return lines[("defaults", top)]
    return lines.get(("tables", index))


def parse_config(
    document: Any,
    source: str = "config",
    lines: LineMap | None = None,
    duplicates: Iterable[Duplicate] = (),
) -> ConfigLoadResult:
    """Validate a parsed YAML document (defaults + tables) into table rows and problems.

    `lines` and `duplicates` (from `load_table_configs`) put the file and line in front of
    each problem and report keys the YAML repeats.
    """
    result = ConfigLoadResult()
    marks = lines or {}
    repeated = list(duplicates)
    shown = source if lines is not None else None

    def report(table: str, field_name: str, message: str, line: int | None) -> None:
        result.problems.append(ConfigProblem(table, field_name, message, line, shown))

    for where, field_name, message, line in repeated:
        if where is None:
            report("*", field_name, message, line)
    if not isinstance(document, Mapping):
        report("*", "(file)", f"{source} must be a mapping with a 'tables' list", 1)
        return result
    for key in sorted(set(document) - {"defaults", "tables"}, key=str):
        report(
            "*", str(key), "unknown top-level key (expected defaults, tables)", marks.get((key,))
        )
    defaults = _known_defaults(document.get("defaults") or {}, marks, report)
    rows = document.get("tables")
    if not isinstance(rows, list):
        report("*", "tables", "must be a list of table rows", marks.get(("tables",)))
        return result
    names = [str(r.get("name")) if isinstance(r, Mapping) and r.get("name") else None for r in rows]
    merged = [{**defaults, **r} if isinstance(r, Mapping) else r for r in rows]
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            report(
                f"#{index + 1}",
                "(row)",
                "must be a mapping of fields",
                marks.get(("tables", index)),
            )
            continue
        label = names[index] or f"#{index + 1}"
        found, table = check_row({**defaults, **row})
        bad = [(f, m, _line_of(marks, index, f, from_row=f in row)) for f, m in found]
        bad += [(f, m, line) for (where, f, m, line) in repeated if where == index]
        repeated_name = _repeated_name(names, index)
        if repeated_name:
            bad.append(("name", repeated_name, _line_of(marks, index, "name", from_row=True)))
        bad += _topic_problems(merged, index, marks, set_here="topic" in row)
        # In file order when lines are known (sorted is stable: the rule order stays otherwise).
        for field_name, message, where in sorted(bad, key=lambda item: item[2] or 0):
            report(label, field_name, message, where)
        shares_topic = _topic_shared_later(merged, index)
        if not bad and names.count(names[index]) == 1 and not shares_topic and table is not None:
            result.tables[label] = table
    return result


def _repeated_name(names: list[str | None], index: int) -> str | None:
    """The problem of a row named like an earlier one (the first of a name is not told twice)."""
    name = names[index]
    if name is None or names.index(name) == index:
        return None
    others = [str(i + 1) for i, n in enumerate(names) if n == name and i != index]
    return (
        f"appears more than once in the config table (also row {', '.join(others)}); "
        "each table needs its own name"
    )


def _topic_of(row: Any) -> tuple[Any, Any] | None:
    """(topic, connection) of a Kafka row, None for other rows."""
    if not isinstance(row, Mapping) or row.get("source") != "kafka" or not row.get("topic"):
        return None
    return (row.get("topic"), row.get("kafka_conn_id", "kafka_default"))


def _topic_problems(
    rows: list[Any], index: int, marks: LineMap, *, set_here: bool
) -> list[tuple[str, str, int | None]]:
    """The row's problem when an earlier row reads its topic, at the line of its topic."""
    shared = _shared_topic(rows, index)
    return [("topic", shared, _line_of(marks, index, "topic", from_row=set_here))] if shared else []


def _topic_shared_later(rows: list[Any], index: int) -> bool:
    """A later row reads this row's topic (neither becomes a table)."""
    topic = _topic_of(rows[index])
    return topic is not None and any(_topic_of(r) == topic for r in rows[index + 1 :])


def _shared_topic(rows: list[Any], index: int) -> str | None:
    """The problem of a Kafka row reading the topic (on the same connection) of an earlier row:
    a table reads only its own topic (`rows` with the defaults merged in)."""
    topic = _topic_of(rows[index])
    if topic is None:
        return None
    earlier = [str(i + 1) for i, other in enumerate(rows[:index]) if _topic_of(other) == topic]
    if not earlier:
        return None
    return (
        f"{topic[0]!r} is also the topic of row {', '.join(earlier)}; a table reads only its own "
        "topic (one topic per source table)"
    )


def _known_defaults(defaults: Any, marks: LineMap, report: Report) -> dict[str, Any]:
    """The `defaults:` fields the rows can take; the others reported at their line."""
    if not isinstance(defaults, Mapping):
        report("*", "defaults", "must be a mapping of table fields", marks.get(("defaults",)))
        return {}
    for key in sorted(set(defaults) - set(FIELDS), key=str):
        report(
            "*",
            f"defaults.{key}",
            f"unknown field{close(key, FIELDS)}",
            marks.get(("defaults", key)),
        )
    return {key: value for key, value in defaults.items() if key in FIELDS}


# Parsed config files by (path, shown path, text): a task process reads its table's row several times
# (its DAG file, the step, the post_execute hooks), and validating 65 rows takes about 0.1 s.
_PARSED: dict[tuple[str, str, str], ConfigLoadResult] = {}
_PARSED_KEPT = 4


def load_table_configs(path: Path | str | None = None) -> ConfigLoadResult:
    """Read and validate the config table file; unreadable YAML is one problem, not an exception.

    The file is read every time; the same text is validated once per process (a copy of the
    result is returned, so a caller never changes what the next one gets)."""
    config_path = Path(path) if path is not None else default_config_path()
    shown = display_path(config_path)
    try:
        text = config_path.read_text()
    except OSError as error:
        return ConfigLoadResult(
            problems=[ConfigProblem("*", "(file)", f"cannot read {config_path}: {error.strerror}")]
        )
    key = (str(config_path.resolve()), str(shown), text)
    parsed = _PARSED.get(key)
    if parsed is None:
        try:
            document, marks, duplicates = compose(text)
        except yaml.YAMLError as error:  # not kept: its message names the path as given
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            why = f": {error.message}" if isinstance(error, UnsafeYamlError) else ""
            problem = f"{config_path} is not valid YAML{where}{why}"
            return ConfigLoadResult(problems=[ConfigProblem("*", "(file)", problem)])
        if len(_PARSED) >= _PARSED_KEPT:
            _PARSED.pop(next(iter(_PARSED)))
        parsed = _PARSED[key] = parse_config(document, shown, marks, duplicates)
    return ConfigLoadResult(dict(parsed.tables), list(parsed.problems))
