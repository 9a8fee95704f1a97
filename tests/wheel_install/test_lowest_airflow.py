"""The lowest Airflow the package declares works: the wheel's light install (no extras) with
apache-airflow 3.2.0 and the lowest providers pyproject.toml accepts, from the package index in
a fresh venv, every other package pinned by tests/wheel_install/lowest-airflow.txt (Airflow's own
constraint files are not reachable here). Airflow loads the DAGs, the provider info and the
view; one `dags test` applies an update and a delete exactly, its steps clients of the test
run's Spark Connect server (tests/conftest.py). The highest end, the pinned stack of
docker/constraints.txt, is what every other test runs on.

Why 3.2.0: the code imports DeadlineAlert, DeadlineReference, SyncCallback, SkipMixin and
CronDataIntervalTimetable from `airflow.sdk`, which the task SDK exports from 1.2.0 (Airflow
3.2.0) on; 1.1.x (Airflow 3.1) has none of them.

About a minute to install with pip's cache warm (the downloads, ~200 MB, when cold).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.wheel_install.test_wheel import Installed, check_airflow, result_of
from tests.wheel_install.wheel_venv import REPO, clean_environment, make_venv, requirements_of

pytestmark = pytest.mark.slow

LOWEST = REPO / "tests" / "wheel_install" / "lowest-airflow.txt"
# The distributions whose lowest version pyproject.toml declares: the lower bound of each range.
RANGED = (
    "apache-airflow",
    "apache-airflow-providers-apache-spark",
    "apache-airflow-providers-apache-kafka",
    "apache-airflow-providers-http",
    "apache-airflow-providers-amazon",
)
VERSIONS = """
import json, importlib.metadata as md
from airflow.providers_manager import ProvidersManager
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
names = ["apache-airflow", "apache-airflow-task-sdk", "pyspark", "pyspark-client",
         "apache-airflow-providers-apache-spark", "apache-airflow-providers-apache-kafka",
         "apache-airflow-providers-http", "apache-airflow-providers-amazon"]
print("RESULT " + json.dumps({
    "versions": {n: version(n) for n in names},
    "connection_types": sorted(ProvidersManager().hooks),
}))
"""


def pins(path: Path) -> dict[str, str]:
    """The `name==version` lines of a constraints file."""
    lines = [x.strip() for x in path.read_text().splitlines()]
    return {
        Requirement(x).name.lower(): str(Requirement(x).specifier).removeprefix("==")
        for x in lines
        if x and not x.startswith("#")
    }


def lower_bound(requirement: Requirement) -> str:
    """The version of the requirement's `>=` clause."""
    (bound,) = [s.version for s in requirement.specifier if s.operator == ">="]
    return bound


@pytest.fixture(scope="module")
def lowest(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    scratch = tmp_path_factory.mktemp("lowest")
    venv = scratch / "venv"
    started = time.monotonic()
    make_venv(venv, built_wheel, "index", constraints=LOWEST)
    print(f"\nlowest Airflow installed with the wheel in {time.monotonic() - started:.1f} s")
    work = scratch / "work"
    work.mkdir()
    return Installed(built_wheel, venv, work, clean_environment(venv, scratch / "airflow_home"))


def test_the_pinned_lowest_versions_are_the_lower_bounds_pyproject_declares(
    built_wheel: Path,
) -> None:
    declared = {r.name.lower(): r for r in requirements_of(built_wheel) if r.marker is None}
    pinned = pins(LOWEST)
    assert {name: lower_bound(declared[name]) for name in RANGED} == {
        name: pinned[name] for name in RANGED
    }
    # Every pin satisfies the wheel's own requirement on it.
    assert {n: pinned[n] for n in declared if not declared[n].specifier.contains(pinned[n])} == {}


@pytest.mark.lowest_airflow
def test_the_lowest_airflow_loads_the_dags_and_a_dags_test_passes_as_a_connect_client(
    lowest: Installed, connect_server: Any
) -> None:
    seen = result_of(lowest.run(lowest.python, "-c", VERSIONS))
    assert seen["versions"] == {
        "apache-airflow": "3.2.0",
        "apache-airflow-task-sdk": "1.2.0",
        "pyspark": None,  # the light install: the Spark Connect client only
        "pyspark-client": "4.2.0",
        "apache-airflow-providers-apache-spark": "6.0.0",
        "apache-airflow-providers-apache-kafka": "1.8.0",
        "apache-airflow-providers-http": "5.5.0",
        "apache-airflow-providers-amazon": "9.39.0",
    }
    assert {"spark", "spark_connect", "kafka", "http", "aws"} <= set(seen["connection_types"])
    began = time.monotonic()
    check_airflow(lowest, connect_server.url)
    print(f"\nlowest Airflow: DagBag and one dags test in {time.monotonic() - began:.1f} s")
    assert not os.path.exists(lowest.venv / "bin" / "spark-submit")
