"""`cdc validate` and `cdc --help` answer without loading Spark, delta-rs or Arrow (a config
check in CI or a pre-commit hook costs a second, not a JVM-sized import)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cdc_pipeline.config import project_root

HEAVY = ("pyspark", "deltalake", "pyarrow", "pandas")
PROBE = """
import contextlib, io, json, sys
from cdc_tools.cli import main
heavy = set(json.loads(sys.argv[2]))
sys.argv = ["cdc", *json.loads(sys.argv[1])]
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main()
    except SystemExit as exit:
        code = exit.code
print(json.dumps([code, sorted({m.split(".")[0] for m in sys.modules} & heavy)]))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "--config", str(project_root() / "config" / "tables.yaml")],
        ["--help"],
        ["run", "--help"],
        ["check", "--help"],
    ],
)
def test_validate_and_help_load_no_spark(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        check=True,
        cwd=project_root(),
    )
    assert json.loads(result.stdout) == [0, []], result.stderr
