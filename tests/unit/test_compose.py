"""docker-compose.yaml agrees with the local set-up (no Docker engine here: parse and validate it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from cdc_pipeline.local_airflow import LocalAirflow

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_SERVICES = [
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
]
SPARK_SERVICES = ["spark-master", "spark-worker-1", "spark-worker-2"]
SHARED = [
    "CDC_CONFIG",
    "CDC_LANDING",
    "CDC_WAREHOUSE",
    "AIRFLOW_CONN_SPARK_DEFAULT",
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__CORE__PLUGINS_FOLDER",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__CORE__LOAD_EXAMPLES",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
]


def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yaml").read_text())


def test_services_and_volumes() -> None:
    services = compose()["services"]
    assert set(services) == {
        "postgres",
        "redis",
        "airflow-init",
        *AIRFLOW_SERVICES,
        *SPARK_SERVICES,
    }
    for name in [*AIRFLOW_SERVICES, *SPARK_SERVICES]:
        assert "cdc-data:/data" in services[name]["volumes"], name
        assert services[name]["build"] == "." and services[name]["image"] == "cdc-lakehouse:latest"
    assert set(compose()["volumes"]) == {"cdc-data", "airflow-home", "postgres-data"}


def test_airflow_settings_match_the_local_set_up(tmp_path: Path) -> None:
    local = LocalAirflow(
        tmp_path, tmp_path / "t.yaml", tmp_path / "l", tmp_path / "w"
    ).environment()
    services = compose()["services"]
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert set(SHARED) <= set(env), name
        assert set(SHARED) <= set(local)
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        # The image holds the repo at /opt/cdc: its config and DAG folders must exist here too.
        for key in ("CDC_CONFIG", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER"):
            assert (REPO / Path(env[key]).relative_to("/opt/cdc")).exists(), key
    data = {
        services[n]["environment"]["CDC_WAREHOUSE"] for n in [*AIRFLOW_SERVICES, *SPARK_SERVICES]
    }
    assert data == {"/data/warehouse"}


def test_spark_default_points_at_the_master() -> None:
    services = compose()["services"]
    connection = json.loads(services["airflow-worker"]["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert connection == {"conn_type": "spark", "host": "spark://spark-master", "port": 7077}
    master = " ".join(services["spark-master"]["command"])
    assert "deploy.master.Master --host spark-master --port 7077" in master
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert "Worker spark://spark-master:7077" in " ".join(services[worker]["command"])


def test_image_installs_the_project_with_java() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert (
        "openjdk-17-jre-headless" in dockerfile and "pip install --no-cache-dir -e ." in dockerfile
    )


def test_docker_compose_validates_the_file() -> None:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose (Debian package) is installed by make install"
    result = subprocess.run(
        [binary, "-f", str(REPO / "docker-compose.yaml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
