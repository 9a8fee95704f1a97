"""docker-compose.yaml is deployable and agrees with the local set-up.

No Docker engine runs here: the file is parsed and checked property by property, and validated
with `docker-compose config` (without an .env it must refuse; with .env.example filled, pass).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_airflow.local.launcher import LocalAirflow

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_SERVICES = [
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
]
SPARK_SERVICES = ["spark-master", "spark-worker-1", "spark-worker-2", "spark-connect"]
# How every step reaches landing and warehouse in the object store (the same in each container).
OBJECT_STORE_ENV = {
    "CDC_LANDING": "s3://cdc/landing",
    "CDC_WAREHOUSE": "s3://cdc/warehouse",
    "AWS_ENDPOINT_URL": "http://object-store:9000",
    "AWS_ALLOW_HTTP": "true",
    "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "${S3_ACCESS_KEY:?set S3_ACCESS_KEY in .env (see .env.example)}",
    "AWS_SECRET_ACCESS_KEY": "${S3_SECRET_KEY:?set S3_SECRET_KEY in .env (see .env.example)}",
    "HADOOP_USER_NAME": "cdc",
}
SHARED = [
    "CDC_CONFIG",
    "CDC_LANDING",
    "CDC_WAREHOUSE",
    "AIRFLOW_CONN_SPARK_DEFAULT",
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__CORE__PLUGINS_FOLDER",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__CORE__LOAD_EXAMPLES",
]
# Secrets every Airflow container must share, and the .env variable each comes from.
SECRETS = {
    "AIRFLOW__API_AUTH__JWT_SECRET": "AIRFLOW_JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY": "AIRFLOW_SECRET_KEY",
    "AIRFLOW__CORE__FERNET_KEY": "AIRFLOW_FERNET_KEY",
}
ENV_SECRETS = [
    *SECRETS.values(),
    "AIRFLOW_ADMIN_PASSWORD",
    "POSTGRES_PASSWORD",
    "S3_ACCESS_KEY",
    "S3_SECRET_KEY",
]
FAB = "apache-airflow-providers-fab==3.10.2"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "docker-compose.yaml").read_text()))


def services() -> dict[str, Any]:
    return dict(compose()["services"])


def required(variable: str) -> str:
    """The interpolation that makes `docker compose` refuse to start without the variable."""
    return f"${{{variable}:?set {variable} in .env (see .env.example)}}"


def test_services_and_volumes_and_no_volume_shared_between_containers() -> None:
    found = services()
    assert set(found) == {
        "postgres",
        "redis",
        "object-store",
        "airflow-init",
        *AIRFLOW_SERVICES,
        *SPARK_SERVICES,
    }
    for name in [*AIRFLOW_SERVICES, *SPARK_SERVICES, "airflow-init"]:
        assert found[name]["build"] == "." and found[name]["image"] == "cdc-lakehouse:latest"
        assert found[name]["user"] == "${AIRFLOW_UID:-50000}:0", name  # never root
    # Each named volume belongs to one service (its own store); the only other mount is the
    # host's config, read-only: containers on different machines share nothing local.
    assert set(compose()["volumes"]) == {"object-data", "postgres-data"}
    owners: dict[str, list[str]] = {}
    for name, service in found.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("./"):
                owners.setdefault(source, []).append(name)
    assert owners == {"object-data": ["object-store"], "postgres-data": ["postgres"]}
    # The image lets any AIRFLOW_UID of group 0 write AIRFLOW_HOME (airflow.cfg, task logs).
    assert "chmod -R g+rwX /opt/airflow" in (REPO / "Dockerfile").read_text()


def test_landing_and_warehouse_are_in_the_object_store_for_every_step() -> None:
    found = services()
    for name in [*AIRFLOW_SERVICES, *SPARK_SERVICES, "airflow-init"]:
        environment = found[name]["environment"]
        for key, value in OBJECT_STORE_ENV.items():
            assert environment[key] == value, (name, key)
    store = found["object-store"]
    assert store["image"].startswith("minio/minio:RELEASE.")  # pinned, never :latest
    assert store["environment"] == {
        "MINIO_ROOT_USER": OBJECT_STORE_ENV["AWS_ACCESS_KEY_ID"],
        "MINIO_ROOT_PASSWORD": OBJECT_STORE_ENV["AWS_SECRET_ACCESS_KEY"],
    }
    assert store["ports"] == ["${S3_CONSOLE_BIND:-127.0.0.1}:9001:9001"]  # the console only
    assert store["healthcheck"]["test"] == ["CMD", "mc", "ready", "local"]
    for name in [*AIRFLOW_SERVICES, "airflow-init"]:
        assert found[name]["depends_on"]["object-store"] == {"condition": "service_healthy"}
    # The init service makes the bucket (the steps never create one) before anything runs.
    script = found["airflow-init"]["command"][-1]
    assert script.index(
        'python -m spark_jobs.runtime.storage --make-bucket "$${CDC_LANDING}" "$${CDC_WAREHOUSE}"'
    ) < script.index("airflow db migrate")


def test_every_long_running_service_restarts_and_has_a_healthcheck() -> None:
    found = services()
    for name, service in found.items():
        if name == "airflow-init":
            assert service["restart"] == "no"
            continue
        assert service["restart"] in ("always", "unless-stopped"), name
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(" ".join(test[1:])) > 5, name
    assert found["airflow-apiserver"]["healthcheck"]["test"][-1].split(" && ") == [
        "curl --fail http://localhost:8080/api/v2/monitor/health",
        "curl --fail http://localhost:8080/execution/health",
    ]
    assert found["airflow-scheduler"]["environment"]["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"]
    assert "--job-type DagProcessorJob" in found["airflow-dag-processor"]["healthcheck"]["test"][1]
    assert "--job-type TriggererJob" in found["airflow-triggerer"]["healthcheck"]["test"][1]
    assert "inspect ping" in found["airflow-worker"]["healthcheck"]["test"][1]
    # The Connect server is healthy when a query's tasks run on executors (not when its port
    # opens while no worker can start one).
    assert found["spark-connect"]["healthcheck"]["test"] == [
        "CMD",
        "python",
        "-m",
        "cdc_airflow.local.connect_server",
        "--probe",
        "sc://127.0.0.1:15002",
    ]


def test_airflow_services_wait_for_healthy_dependencies_and_the_init_service() -> None:
    found = services()
    for name in AIRFLOW_SERVICES:
        depends = found[name]["depends_on"]
        assert depends["postgres"] == {"condition": "service_healthy"}, name
        assert depends["redis"] == {"condition": "service_healthy"}, name
        assert depends["airflow-init"] == {"condition": "service_completed_successfully"}, name
    worker = found["airflow-worker"]["depends_on"]
    assert (
        worker["airflow-apiserver"] == worker["spark-connect"] == {"condition": "service_healthy"}
    )
    for name in ["spark-worker-1", "spark-worker-2", "spark-connect"]:
        assert found[name]["depends_on"] == {"spark-master": {"condition": "service_healthy"}}


def test_the_init_service_migrates_creates_the_admin_checks_the_connection_and_the_pools() -> None:
    init = services()["airflow-init"]
    script = init["command"][-1]
    steps = [
        "airflow db migrate",
        "airflow users create --role Admin",
        '--password "$${AIRFLOW_ADMIN_PASSWORD}"',
        "airflow connections get spark_default",
        "python -m cdc_airflow.local.launcher --print-pools > /tmp/cdc_pools.json",
        "airflow pools import /tmp/cdc_pools.json",
    ]
    positions = [script.index(step) for step in steps]
    assert positions == sorted(positions)
    assert init["command"][0] == "-euc"  # any failing step fails the init, and so the start
    assert init["environment"]["AIRFLOW_ADMIN_PASSWORD"] == required("AIRFLOW_ADMIN_PASSWORD")


def test_secrets_come_from_the_env_file_and_are_shared_by_every_airflow_container() -> None:
    found = services()
    for name in [*AIRFLOW_SERVICES, "airflow-init"]:
        env = found[name]["environment"]
        for key, variable in SECRETS.items():
            assert env[key] == required(variable), (name, key)
        password = required("POSTGRES_PASSWORD")
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == (
            f"postgresql+psycopg2://airflow:{password}@postgres:5432/airflow"
        )
        # The image has psycopg2: SQLAlchemy 2.1's default PostgreSQL driver is psycopg (3), so
        # a bare db+postgresql:// result backend stopped the Celery worker at its start.
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == (
            f"db+postgresql+psycopg2://airflow:{password}@postgres:5432/airflow"
        )
        assert env["AIRFLOW__CORE__AUTH_MANAGER"] == (
            "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
        )
    assert found["postgres"]["environment"]["POSTGRES_PASSWORD"] == required("POSTGRES_PASSWORD")
    text = (REPO / "docker-compose.yaml").read_text()
    assert "change-me" not in text and "admin:admin" not in text and "airflow:airflow@" not in text
    assert found["airflow-apiserver"]["ports"] == ["${AIRFLOW_API_BIND:-127.0.0.1}:8080:8080"]
    example = (REPO / ".env.example").read_text()
    for variable in ENV_SECRETS:
        assert re.search(rf"^{variable}=$", example, re.M), f"{variable} is documented, empty"
    assert ".env" in (REPO / ".gitignore").read_text().split()
    assert ".env" in (REPO / ".dockerignore").read_text().split()


def test_airflow_settings_match_the_local_set_up(tmp_path: Path) -> None:
    local = LocalAirflow(
        tmp_path, tmp_path / "t.yaml", tmp_path / "l", tmp_path / "w"
    ).environment()
    found = services()
    for name in AIRFLOW_SERVICES:
        env = found[name]["environment"]
        assert set(SHARED) <= set(env), name
        assert set(SHARED) <= set(local)
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        # The image holds the repo at /opt/cdc: its config and DAG folders must exist here too.
        for key in ("CDC_CONFIG", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER"):
            assert (REPO / Path(env[key]).relative_to("/opt/cdc")).exists(), key
    data = {found[n]["environment"]["CDC_WAREHOUSE"] for n in [*AIRFLOW_SERVICES, *SPARK_SERVICES]}
    assert data == {"s3://cdc/warehouse"}


def test_spark_default_is_the_spark_connect_server_on_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = services()
    value = found["airflow-worker"]["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert json.loads(value) == {
        "conn_type": "spark_connect",
        "host": "sc://spark-connect",
        "port": 15002,
    }
    # The provider's own hook turns it into the Connect URL the tasks use.
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", value)
    assert SparkConnectHook("spark_default").get_connection_url() == "sc://spark-connect:15002/"
    # The service runs the local launcher's own server: run its command line here up to the
    # exec, and check the spark-submit it would become.
    command = found["spark-connect"]["command"]
    assert command[:4] == ["python", "-m", "cdc_airflow.local.connect_server", "--exec"]
    from cdc_airflow.local import connect_server

    became: list[list[str]] = []

    def execve(path: str, args: list[str], env: dict[str, str]) -> None:
        became.append(args)
        raise SystemExit(0)  # exec does not return

    monkeypatch.setattr(connect_server.os, "execve", execve)
    with pytest.raises(SystemExit):
        connect_server.main(command[3:])
    (submit,) = became
    assert submit[0].endswith("/bin/spark-submit")
    assert submit[-1] == str(connect_server.DRIVER_PROGRAM) and "--class" not in submit
    settings = dict(submit[i + 1].split("=", 1) for i, arg in enumerate(submit) if arg == "--conf")
    # Spark's Connect plugin on the project's driver program, sessions sharing compiled code.
    assert settings["spark.plugins"] == connect_server.PLUGIN_CLASS
    assert settings["spark.sql.artifact.isolation.enabled"] == "false"
    assert submit[submit.index("--master") + 1] == "spark://spark-master:7077"
    assert settings["spark.connect.grpc.binding.port"] == "15002"
    assert settings["spark.connect.grpc.binding.address"] == "0.0.0.0"
    assert settings["spark.driver.host"] == "spark-connect"
    assert settings["spark.driver.bindAddress"] == "0.0.0.0"
    # The same settings as the local server: FAIR between tables, the project's jars, logging.
    local = connect_server.server_conf(15002, host="0.0.0.0")
    for key in ("spark.scheduler.mode", "spark.jars", "spark.driver.extraJavaOptions"):
        assert settings.get(key) == local.get(key), key
    assert settings["spark.scheduler.mode"] == "FAIR"
    master = " ".join(found["spark-master"]["command"])
    assert "deploy.master.Master --host spark-master --port 7077" in master
    for worker in ("spark-worker-1", "spark-worker-2"):
        line = " ".join(found[worker]["command"])
        assert "Worker spark://spark-master:7077" in line
        # A work directory the container's user (AIRFLOW_UID) can write: $SPARK_HOME/work is root's.
        assert "--work-dir /tmp/spark-work" in line


def test_every_project_container_has_an_init_the_notifiers_and_the_hosts_config() -> None:
    found = services()
    for name in [*AIRFLOW_SERVICES, *SPARK_SERVICES, "airflow-init"]:
        assert found[name]["init"] is True, name  # PID 1 reaps and forwards signals
    for name in [*AIRFLOW_SERVICES, "airflow-init"]:
        environment = found[name]["environment"]
        assert environment["AIRFLOW_VAR_CDC_NOTIFIERS"] == "${CDC_NOTIFIERS:-}", name
        # Adding a table is a config row on the host, not an image rebuild.
        assert "./config:/opt/cdc/config:ro" in found[name]["volumes"], name
        assert environment["CDC_CONFIG"] == "/opt/cdc/config/tables.yaml"
    # The image fetches the Spark jars itself, pinned by the same pom as `make install`.
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "mvn -q -B -f /build/jars-pom.xml dependency:copy-dependencies" in dockerfile
    assert "COPY --from=jars /build/jars /opt/cdc/jars" in dockerfile
    assert "CDC_SPARK_JARS=/opt/cdc/jars" in dockerfile  # not beside the installed package
    assert "jars" in (REPO / ".dockerignore").read_text().splitlines()


def constraints() -> dict[str, str]:
    lines = (REPO / "docker" / "constraints.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {name.lower().replace("_", "-"): version for name, version in pins}


def test_the_image_installs_the_project_fab_and_clients_under_the_committed_constraints() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "openjdk-17-jre-headless" in dockerfile and " curl" in dockerfile
    install = dockerfile[dockerfile.index("RUN pip install") :].split("ENV")[0]
    # The built wheel with its `deploy` extra, as users install the package: no source tree in
    # the image (editable or not) that `python -m` could import from the working directory.
    assert "RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist /src" in dockerfile
    assert '--constraint docker/constraints.txt "$(ls /tmp/dist/*.whl)[deploy]"' in install
    assert " -e " not in dockerfile and "COPY . ." not in dockerfile
    for folder in ("config", "dags", "plugins"):
        assert f"COPY {folder} /opt/cdc/{folder}" in dockerfile, folder
    assert "pip check" in install
    # The image's extras are pyproject's `deploy` extra, which the topology test's venv
    # (make: .tools/deploy) installs under the same constraints.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deploy = project["optional-dependencies"]["deploy"]
    assert FAB in deploy
    makefile = (REPO / "Makefile").read_text()
    assert "--constraint docker/constraints.txt -e '.[deploy]'" in makefile
    pins = constraints()
    assert pins["apache-airflow-providers-fab"] == "3.10.2"
    # Found by running the services as processes: Airflow 3.3 also opens its metadata DB through
    # an async engine (postgresql -> asyncpg), and celery 5.7 dropped the `retry` the Celery
    # provider 3.26.0 imports from celery.backends.database (worker and executor failed to load).
    assert "asyncpg" in pins and any(d.startswith("asyncpg") for d in deploy)
    assert pins["apache-airflow-providers-celery"] == "3.26.0" and pins["celery"] == "5.6.3"
    # The image gets what the tests ran on: every package the venv also has, at its version
    # (python-dateutil too since botocore, the amazon provider's, needs <3 as FAB does).
    differing = {}
    for name, version in pins.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if installed != version:
            differing[name] = (installed, version)
    assert differing == {}, differing
    for name in ("apache-airflow", "pyspark", "pyspark-client", "deltalake"):
        assert pins[name] == metadata.version(name), name


def run_compose(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose (Debian package) is installed by make install"
    return subprocess.run(
        [binary, "-f", str(REPO / "docker-compose.yaml"), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_docker_compose_refuses_to_start_without_the_env_file(tmp_path: Path) -> None:
    result = run_compose("--project-directory", str(tmp_path), "config", "-q")
    assert result.returncode != 0
    assert re.search(r"set \w+ in \.env \(see \.env\.example\)", result.stderr), result.stderr
    # Each secret on its own: a filled .env without it is refused, naming it.
    filled = fill(tmp_path)
    for variable in ENV_SECRETS:
        partial = tmp_path / f"without-{variable}"
        partial.write_text(re.sub(rf"^{variable}=.*$", f"{variable}=", filled, flags=re.M))
        result = run_compose("--env-file", str(partial), "config", "-q")
        assert result.returncode != 0 and f"set {variable} in .env" in result.stderr, variable


def fill(directory: Path) -> str:
    """.env.example with a value for every empty secret."""
    text = (REPO / ".env.example").read_text()
    return re.sub(r"^([A-Z0-9_]+)=$", r"\1=not-a-real-secret-\1", text, flags=re.M)


def test_docker_compose_validates_the_file_with_the_example_env_filled(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(fill(tmp_path))
    result = run_compose("--env-file", str(env_file), "config")
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)["services"]
    env = rendered["airflow-apiserver"]["environment"]
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == "not-a-real-secret-AIRFLOW_JWT_SECRET"
    assert rendered["airflow-apiserver"]["ports"] == ["127.0.0.1:8080:8080/tcp"]
    connect = rendered["spark-connect"]["environment"]
    assert connect["AWS_ACCESS_KEY_ID"] == "not-a-real-secret-S3_ACCESS_KEY"
    assert connect["CDC_WAREHOUSE"] == "s3://cdc/warehouse"


def test_a_users_spark_plugins_run_beside_the_connect_plugin() -> None:
    from cdc_airflow.local import connect_server

    plugin = connect_server.PLUGIN_CLASS
    extra = {"spark.plugins": "com.example.Metrics, com.example.Audit"}
    settings = connect_server.server_conf(15002, extra)
    assert settings["spark.plugins"] == f"{plugin},com.example.Metrics,com.example.Audit"
    # Named again by the user: once, first.
    again = connect_server.server_conf(15002, {"spark.plugins": f"com.example.Metrics,{plugin}"})
    assert again["spark.plugins"] == f"{plugin},com.example.Metrics"
    assert connect_server.server_conf(15002)["spark.plugins"] == plugin
