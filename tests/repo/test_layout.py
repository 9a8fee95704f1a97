"""The code's layout rules, checked by reading the source (no imports of the modules).

- No module imports a private name (`_x`) of another module of the four packages: what a
  module shares is public, so it can be found and its users can be counted.
- No function of the four packages is over MAX_LINES lines unless LONG_FUNCTIONS lists it with
  its current length and a reason. The list is a ratchet: it fails when a listed function grows,
  when it shrinks (lower the number) and when it is gone or no longer over the limit (remove it),
  so the list only gets shorter.
- No function takes a bool flag positionally or 7+ positional parameters unless
  POSITIONAL_FLAGS / WIDE_SIGNATURES lists it (issue 53: signatures like delta-rs'): a ratchet
  as LONG_FUNCTIONS is, so the lists only get shorter.
- The Spark steps persist a frame only through `spark_jobs.rules.transforms.persisted`: Spark's
  cache is shared by every session of a Connect server, and a plain `persist()` a killed run left
  behind would answer a later run's equal plan with rows read before a file was rewritten.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cdc_pipeline", "cdc_airflow", "spark_jobs", "cdc_tools")
MAX_LINES = 60

# Functions over MAX_LINES lines (def line to last line), by qualified name: their length now.
# One line of reason each; split one, then lower or remove its entry.
LONG_FUNCTIONS = {
    # one Spark pass over final, tombstones and staging per key (one scan, one shuffle)
    "spark_jobs.check._key_breaches": 72,
    # the extract vs final comparison as one Spark plan (I, U, D rows)
    "spark_jobs.formats.snapshot.derive_changes": 67,
    # the Debezium envelope's column expressions, one per field kind
    "spark_jobs.formats.debezium.parse_debezium": 90,
    # the crash-recovery cases of one file version, kept together to be read as one rule
    "spark_jobs.staging.recovery.settle_unrecorded": 93,
    # the generator's change mix of one hour, as one Spark plan
    "cdc_tools.generator._hour_changes": 80,
}

# Positional bool flags (`f(x, True)` reads as nothing at the call site) and functions with 7
# or more positional parameters, by qualified name: the parameters. A ratchet like
# LONG_FUNCTIONS: make the flag keyword-only (after `*`) or split the function, then remove the
# entry; a new one fails the test.
POSITIONAL_FLAGS = {
    # replaces Airflow's WatchedSubprocess._service_subprocess: it keeps Airflow's signature
    "cdc_airflow.local.executor.notice_exit_at_once._service_subprocess": ("raise_on_timeout",),
}
WIDE_SIGNATURES: dict[str, int] = {}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    """(dotted module name, parsed source) of every module of the four packages."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), ast.parse(path.read_text(), filename=str(path))


def _imported_module(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute name of the module a `from ... import` reads (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _functions() -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method (nested ones too), with its qualified name."""

    def visit(
        node: ast.AST, prefix: str
    ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}.{child.name}"
                yield name, child
                yield from visit(child, name)
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}.{child.name}")
            else:
                yield from visit(child, prefix)

    for module, tree in _modules():
        yield from visit(tree, module)


def _function_lengths() -> dict[str, int]:
    """Lines of every function and method (nested ones too), by qualified name."""
    return {name: (node.end_lineno or node.lineno) - node.lineno + 1 for name, node in _functions()}


def test_no_module_imports_a_private_name_of_another_module() -> None:
    packages = {
        ".".join(p.relative_to(ROOT).parent.parts)
        for package in PACKAGES
        for p in (ROOT / package).rglob("__init__.py")
    }
    found = []
    for module, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _imported_module(module, node, module in packages)
            if source.split(".")[0] not in PACKAGES or source == module:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private:
                    found.append(f"{module}:{node.lineno} imports {alias.name} from {source}")
    assert found == [], "make the name public or move the code: " + "; ".join(found)


def test_no_function_is_over_the_limit_unless_listed() -> None:
    lengths = _function_lengths()
    unlisted = {
        name: lines
        for name, lines in lengths.items()
        if lines > MAX_LINES and name not in LONG_FUNCTIONS
    }
    assert unlisted == {}, (
        f"functions over {MAX_LINES} lines: split them (extract steps that read top-down)"
    )


def test_the_long_function_list_only_shrinks() -> None:
    lengths = _function_lengths()
    problems = []
    for name, listed in LONG_FUNCTIONS.items():
        lines = lengths.get(name)
        if lines is None:
            problems.append(f"{name} is gone: remove it from LONG_FUNCTIONS")
        elif lines <= MAX_LINES:
            problems.append(f"{name} is {lines} lines, within the limit: remove it")
        elif lines > listed:
            problems.append(f"{name} grew from {listed} to {lines} lines: split it instead")
        elif lines < listed:
            problems.append(f"{name} shrank from {listed} to {lines} lines: lower its entry")
    assert problems == []


def test_the_steps_persist_only_through_persisted() -> None:
    found = []
    for module, tree in _modules():
        if not module.startswith("spark_jobs."):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("persist", "cache")
                and module != "spark_jobs.rules.transforms"
            ):
                found.append(f"{module}:{node.lineno}: .{node.func.attr}()")
    assert found == []


def _signatures() -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
    """(positional bool parameters, count of positional parameters when 7 or more) of every
    function and method, by qualified name (`self`/`cls` not counted)."""
    flags: dict[str, tuple[str, ...]] = {}
    wide: dict[str, int] = {}
    for name, node in _functions():
        positional = [
            a for a in (*node.args.posonlyargs, *node.args.args) if a.arg not in ("self", "cls")
        ]
        bools = tuple(
            a.arg
            for a in positional
            if isinstance(a.annotation, ast.Name) and a.annotation.id == "bool"
        )
        if bools:
            flags[name] = bools
        if len(positional) >= 7:
            wide[name] = len(positional)
    return flags, wide


def test_signatures_take_flags_by_keyword_and_few_positional_parameters() -> None:
    flags, wide = _signatures()
    problems = []
    for name, found in flags.items():
        listed = POSITIONAL_FLAGS.get(name)
        if listed is None or not set(found) <= set(listed):
            problems.append(f"{name} takes {found} positionally: put them after `*`")
    for name, listed_flags in POSITIONAL_FLAGS.items():
        if flags.get(name) != listed_flags:
            problems.append(f"{name} is now {flags.get(name)}: update or remove its entry")
    for name, count in wide.items():
        if count > WIDE_SIGNATURES.get(name, 6):
            problems.append(f"{name} takes {count} positional parameters: make some keyword-only")
    for name, listed_count in WIDE_SIGNATURES.items():
        if wide.get(name) != listed_count:
            problems.append(f"{name} now takes {wide.get(name)}: lower or remove its entry")
    assert problems == []
