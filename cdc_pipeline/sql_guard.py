"""The config's SQL is data, not code: an allow-list check of `partition_expression`.

`partition_expression` is the only SQL the config table carries (column names and types are
checked by pattern, and reach Spark as `F.col`/`cast` arguments, never as SQL text). Spark
would run whatever it is given: `java_method('java.lang.System', 'load', ...)` loads a native
library, `reflect(...)` reads the environment, `(SELECT ... FROM text.`/etc/hostname`)` reads
a file. So an expression may only hold column references, literals, operators and the
deterministic scalar functions of `ALLOWED_FUNCTIONS`.

Two layers check it against that one list, so they cannot drift apart:
- at validation time, without Spark: the text is parsed with sqlglot's Spark dialect (a pure
  Python SQL parser with a Spark grammar, pinned in pyproject.toml) and every node of the tree
  must be an allowed construct (`expression_problems`);
- before the first write, on Spark's analysed plan (`spark_jobs/rules/expression_check.py`): the
  function names the analyser resolved must be in the same list (`analysed_function_problems`),
  which catches a function sqlglot reads differently from Spark.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from functools import lru_cache
from typing import Any

from cdc_pipeline.columns import TECHNICAL_PREFIX

REFLECTION = frozenset({"reflect", "java_method", "try_reflect"})
NONDETERMINISTIC = frozenset(
    {
        "rand",
        "random",
        "randn",
        "randstr",
        "uniform",
        "uuid",
        "shuffle",
        "current_timestamp",
        "current_date",
        "curdate",
        "now",
        "localtimestamp",
        "current_timezone",
        "monotonically_increasing_id",
        "spark_partition_id",
        "input_file_name",
        "input_file_block_start",
        "input_file_block_length",
        "current_user",
        "session_user",
        "user",
        "current_database",
        "current_schema",
        "current_catalog",
        "version",
    }
)
# Deterministic scalar functions, by the name Spark (and sqlglot's Spark generator) gives them.
ALLOWED_FUNCTIONS = frozenset(
    {
        # date and time
        "year", "month", "day", "dayofmonth", "dayofweek", "dayofyear", "weekday", "weekofyear",
        "quarter", "hour", "minute", "second", "to_date", "try_to_date", "to_timestamp",
        "to_timestamp_ntz", "to_timestamp_ltz", "try_to_timestamp", "date_format", "date_trunc",
        "trunc", "date_add", "date_sub", "dateadd", "datediff", "date_diff", "add_months",
        "months_between", "last_day", "next_day", "make_date", "make_timestamp",
        "make_timestamp_ntz", "unix_timestamp", "to_unix_timestamp", "from_unixtime",
        "unix_date", "unix_seconds", "unix_millis", "unix_micros", "timestamp_seconds",
        "timestamp_millis", "timestamp_micros", "date_from_unix_date", "from_utc_timestamp",
        "to_utc_timestamp", "extract", "date_part", "datepart", "timestampadd", "timestampdiff",
        # strings
        "upper", "lower", "ucase", "lcase", "initcap", "trim", "ltrim", "rtrim", "btrim",
        "substr", "substring", "substring_index", "left", "right", "length", "char_length",
        "character_length", "octet_length", "bit_length", "concat", "concat_ws", "lpad", "rpad",
        "replace", "translate", "regexp_extract", "regexp_replace", "regexp_substr", "split",
        "split_part", "format_string", "printf", "instr", "locate", "position", "reverse",
        "repeat", "ascii", "chr", "char", "base64", "unbase64", "hex", "unhex", "encode",
        "decode", "to_char", "to_number", "try_to_number", "contains", "startswith",
        "endswith", "like", "ilike", "rlike", "regexp", "regexp_like", "soundex", "levenshtein",
        "elt", "overlay", "format_number", "space", "element_at", "size",
        # math
        "abs", "ceil", "ceiling", "floor", "round", "bround", "pmod", "mod", "sign", "signum",
        "sqrt", "cbrt", "pow", "power", "exp", "ln", "log", "log10", "log2", "greatest", "least",
        "negative", "positive", "div", "bin", "conv", "width_bucket", "try_add", "try_subtract",
        "try_multiply", "try_divide", "try_mod", "shiftleft", "shiftright", "shiftrightunsigned",
        "bit_count", "nanvl", "isnan", "degrees", "radians", "pi", "e",
        # hashes
        "md5", "sha", "sha1", "sha2", "crc32", "hash", "xxhash64",
        # conditionals and nulls
        "coalesce", "nvl", "nvl2", "nullif", "ifnull", "if", "case", "isnull", "isnotnull",
        "nullifzero", "zeroifnull", "between", "in",
        # casts (and the cast-named shorthands Spark accepts)
        "cast", "try_cast", "boolean", "tinyint", "smallint", "int", "bigint", "float", "double",
        "decimal", "string", "date", "timestamp", "binary",
    }
)  # fmt: skip
# Words that look like calls in an analysed plan but are Scala's printing of options.
_PLAN_NOISE = frozenset({"some", "none"})


def _function_problem(name: str) -> str:
    """Why the function `name` is refused, or '' when it is allowed."""
    if name in ALLOWED_FUNCTIONS:
        return ""
    if name in REFLECTION:
        return f"{name}() calls Java methods by reflection"
    if name in NONDETERMINISTIC:
        return f"{name}() is nondeterministic (a key's partition must not depend on when or where it runs)"
    return f"{name}() is not an allowed function (only deterministic scalar functions: date/time, string, math, hash, cast, conditional)"


def expression_problems(
    expression: str,
    columns: Collection[str] | None,
    format_columns: Collection[str] = (),
) -> list[str]:
    """Why `expression` may not be a partition expression (empty when it may).

    `columns` are the declared columns (None when the files give the schema: then only `_cdc_`
    references are checked); `format_columns` the change format's `_cdc_` columns. Names match
    case-insensitively, as Spark resolves them by default.
    """
    text = expression.strip()
    if not text:
        return ["must not be empty"]
    problems, references = _parsed_problems(text)
    known = {c.lower() for c in format_columns}
    if columns is not None:
        known |= {c.lower() for c in columns}
    for position, name in references:
        problem = _column_problem(name, known, format_columns, declared=columns is not None)
        if problem and problem not in problems:
            problems.insert(position, problem)
    return problems


@lru_cache(maxsize=1024)
def _parsed_problems_cached(text: str) -> tuple[tuple[str, ...], tuple[tuple[int, str], ...]]:
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError, TokenError

    try:
        statements = [s for s in sqlglot.parse(text, dialect="spark") if s is not None]
    except (ParseError, TokenError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "syntax error"
        return (f"{text!r} cannot be parsed as a Spark SQL expression ({reason})",), ()
    if len(statements) != 1:
        return (f"{text!r} must be one expression, not {len(statements)} statements",), ()
    problems: list[str] = []
    references: list[tuple[int, str]] = []
    for node in statements[0].walk():
        if isinstance(node, exp.Column) and not (
            node.table or node.args.get("db") or node.args.get("catalog")
        ):
            # Checked per row against its columns; remembered with its place among problems.
            references.append((len(problems) + len(references), str(node.name)))
            continue
        problem = _node_problem(node, exp)
        if problem and problem not in problems:
            problems.append(problem)
    return tuple(problems), tuple(references)


def _parsed_problems(text: str) -> tuple[list[str], list[tuple[int, str]]]:
    """The problems of the expression's constructs and its column references, parsed once per
    distinct text (many rows share one expression; the columns are checked per row)."""
    problems, references = _parsed_problems_cached(text)
    return list(problems), list(references)


def _node_problem(node: Any, exp: Any) -> str:
    """Why one parsed node is refused, or '' when it is an allowed construct."""
    if isinstance(node, exp.Query | exp.Subquery | exp.Table | exp.From | exp.Exists):
        return "a subquery or table/file read is not allowed (only columns of the change row)"
    if isinstance(node, exp.Star):
        return "`*` is not allowed (name the columns)"
    if isinstance(node, exp.Window):
        return "a window function is not allowed (the value must come from the row alone)"
    if isinstance(node, exp.AggFunc):
        name = _func_name(node, exp)
        return (
            f"aggregate function {name}() is not allowed (the value must come from the row alone)"
        )
    if isinstance(node, exp.Lambda):
        return "a lambda (x -> ...) is not allowed"
    if isinstance(node, exp.Column):
        return f"{node.sql(dialect='spark')!r}: qualified names are not allowed (name a column of the row)"
    if isinstance(node, _allowed_nodes(exp)):
        return ""
    if isinstance(node, exp.Func):
        return _function_problem(_func_name(node, exp))
    return f"{node.sql(dialect='spark')!r} ({type(node).__name__}) is not an allowed construct"


def _allowed_nodes(exp: Any) -> tuple[type, ...]:
    """Operators, literals and other non-function constructs an expression may use."""
    return (
        exp.Identifier, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Neg, exp.Not,
        exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.IntDiv, exp.EQ, exp.NEQ, exp.GT,
        exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.And, exp.Or, exp.Xor,
        exp.BitwiseAnd, exp.BitwiseOr, exp.BitwiseXor, exp.BitwiseNot, exp.BitwiseLeftShift,
        exp.BitwiseRightShift, exp.DPipe, exp.Like, exp.ILike, exp.RegexpLike, exp.Is, exp.In,
        exp.Between, exp.Bracket, exp.DataType, exp.DataTypeParam, exp.Var, exp.Interval,
        exp.HexString,
    )  # fmt: skip


def _func_name(node: Any, exp: Any) -> str:
    """The Spark name of a parsed function: as written when sqlglot does not know it, else as
    sqlglot's Spark generator writes it (sqlglot normalises synonyms, e.g. nvl -> coalesce)."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    written = node.sql(dialect="spark").strip()
    match = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*(\(|$)", written)
    return match.group(1).lower() if match else type(node).__name__.lower()


def _column_problem(
    name: str, known: set[str], format_columns: Collection[str], *, declared: bool
) -> str:
    lowered = name.lower()
    if lowered.startswith(TECHNICAL_PREFIX) and lowered not in known:
        listed = ", ".join(format_columns) or "none"
        return f"{name!r} is not a column of the change format (those are: {listed})"
    if declared and lowered not in known:
        return f"{name!r} is not a declared column"
    return ""


def string_literals(expression: str) -> list[str]:
    """The string literals of a parsed expression (an analysed plan prints them unquoted)."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(expression, dialect="spark")
    return [str(n.this) for n in tree.walk() if isinstance(n, exp.Literal) and n.is_string]


def function_names_in_plan(projection: str, literals: Iterable[str] = ()) -> set[str]:
    """Lower-case names of the calls in one line of an analysed plan, e.g. `year(` -> year.

    String literals print unquoted there, so text such as 'a(b)' is removed first (only
    literals holding a parenthesis can look like a call).
    """
    text = projection
    for literal in sorted(literals, key=len, reverse=True):
        if "(" in literal:
            text = text.replace(literal, " ")
    names = {m.lower() for m in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", text)}
    return names - _PLAN_NOISE


def analysed_function_problems(names: Iterable[str]) -> list[str]:
    """Why the functions Spark's analyser resolved are refused (same list as the parser layer)."""
    return [p for p in (_function_problem(n) for n in sorted(set(names))) if p]
