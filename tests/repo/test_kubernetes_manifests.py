"""deploy/kubernetes/ is valid for the Kubernetes API and the Airflow chart, and agrees with compose.

No cluster runs here: every object of the manifests is validated offline against the Kubernetes
API schemas (`kubernetes-validate`, strict: an unknown field is an error), the Helm values
against the official Airflow chart's values.schema.json, and the Spark commands against
docker-compose.yaml's. Nothing is applied, installed or started (docs/kubernetes.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
VALUES = DEPLOY / "airflow-values.yaml"
MANIFESTS = [path for path in sorted(DEPLOY.glob("*.yaml")) if path != VALUES]
# The Kubernetes the manifests are written for, and the newest the validator knows.
KUBERNETES_VERSIONS = ["1.34.0", "1.37.0"]
# The official Airflow chart's values schema the values were written against: chart 1.21.0, as
# apache/airflow's main branch held it (its Chart.yaml says 1.21.0). Not committed (809 KB);
# the test reads a copy from CDC_AIRFLOW_CHART_SCHEMA or .tools/ and checks it is that file.
CHART_VERSION = "1.21.0"
CHART_COMMIT = "d14862c7260f772e6222236f4030e41306dd3667"
CHART_SCHEMA_URL = (
    f"https://raw.githubusercontent.com/apache/airflow/{CHART_COMMIT}/chart/values.schema.json"
)
CHART_SCHEMA_SHA256 = "7fcf52dbaaa3e953713f5e2bf937783ea6b8ade584fa40d50bfebcfed4372a2c"
CHART_SCHEMA = Path(
    os.environ.get("CDC_AIRFLOW_CHART_SCHEMA")
    or REPO / ".tools" / "airflow-chart" / "values.schema.json"
)
POD_IP = "10.1.2.3"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def objects() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in documents(path)]


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def container(deployment: str) -> dict[str, Any]:
    (only,) = named("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return dict(only)


def compose_services() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "docker-compose.yaml").read_text())["services"])


def test_the_manifests_are_there() -> None:
    assert [path.name for path in MANIFESTS] == ["spark-connect.yaml"]
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objects())
    assert ("Deployment", "spark-connect") in kinds and ("Service", "spark-connect") in kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid_for_the_kubernetes_api(version: str) -> None:
    problems = []
    for obj in objects():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = "/".join(str(p) for p in error.path)
            problems.append(f"{obj['kind']}/{obj['metadata']['name']} at {where}: {error.message}")
    assert problems == []


def test_the_validator_refuses_an_unknown_field_and_a_wrong_type() -> None:
    deployment = named("Deployment", "spark-connect")
    typo = json.loads(json.dumps(deployment))
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBERNETES_VERSIONS[0], strict=True)
    wrong = json.loads(json.dumps(deployment))
    wrong["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES_VERSIONS[0], strict=True)


def chart_schema() -> dict[str, Any]:
    assert CHART_SCHEMA.is_file(), (
        f"the Airflow chart's values.schema.json is not at {CHART_SCHEMA}: "
        f"curl -o .tools/airflow-chart/values.schema.json {CHART_SCHEMA_URL}"
    )
    data = CHART_SCHEMA.read_bytes()
    assert hashlib.sha256(data).hexdigest() == CHART_SCHEMA_SHA256, (
        f"{CHART_SCHEMA} is not the chart {CHART_VERSION} schema of {CHART_SCHEMA_URL}"
    )
    return dict(json.loads(data))


@pytest.mark.chart_schema
def test_the_values_are_valid_for_the_airflow_charts_schema() -> None:
    schema = chart_schema()
    values = yaml.safe_load(VALUES.read_text())
    errors = [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in jsonschema.Draft7Validator(schema).iter_errors(values)
    ]
    assert errors == []
    # The schema's root accepts any key; every key used must be one of the chart's.
    assert sorted(set(values) - set(schema["properties"])) == []
    header = VALUES.read_text().split("\n\n", 1)[0]
    assert f"chart version {CHART_VERSION}" in header and CHART_COMMIT in header


@pytest.mark.chart_schema
def test_the_charts_schema_refuses_a_misspelt_key() -> None:
    schema = chart_schema()
    values = yaml.safe_load(VALUES.read_text())
    values["redis"]["passwordSecret"] = values["redis"].pop("passwordSecretName")
    assert list(jsonschema.Draft7Validator(schema).iter_errors(values)) != []
    values = yaml.safe_load(VALUES.read_text())
    values["dags"]["persistence"]["enabled"] = "no"
    assert list(jsonschema.Draft7Validator(schema).iter_errors(values)) != []


def test_the_values_deploy_the_light_install_with_celery_and_the_cdc_settings() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert values["executor"] == "CeleryExecutor"
    env = {item["name"]: item["value"] for item in values["env"]}
    assert env["CDC_CONFIG"] == "/opt/cdc/config/tables.yaml"
    assert env["CDC_LANDING"].startswith("s3://") and env["CDC_WAREHOUSE"].startswith("s3://")
    assert not any(key.startswith("AWS_SECRET") for key in env)
    (mount,) = values["volumeMounts"]
    assert mount["mountPath"] == str(Path(env["CDC_CONFIG"]).parent)
    assert "secretRef" in values["extraEnvFrom"]
    assert "cdc" in values["config"]
    # The spark_default the values document is the Connect Service of the manifests.
    line = re.search(r"AIRFLOW_CONN_SPARK_DEFAULT +(\{.*\})", VALUES.read_text())
    assert line is not None
    connection = json.loads(line.group(1))
    service = named("Service", "spark-connect")
    assert connection["host"] == f"sc://{service['metadata']['name']}"
    assert connection["port"] == service["spec"]["ports"][0]["port"]
    # The image: the official Airflow image plus the wheel without extras (pyspark-client).
    dockerfile = (DEPLOY / "airflow.Dockerfile").read_text()
    assert "FROM apache/airflow:3.3.2-python3.11" in dockerfile
    assert '"$(ls /tmp/dist/*.whl)"' in dockerfile and "[spark]" not in dockerfile
    assert "dags/cdc_tables.py dags/cdc_config_errors.py /opt/airflow/dags/" in dockerfile


def spark_submit(arguments: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The spark-submit command line `python -m cdc_airflow.local.connect_server ARGS` execs."""
    from cdc_airflow.local import connect_server

    became: list[list[str]] = []

    def execve(path: str, args: list[str], env: dict[str, str]) -> None:
        became.append(args)
        raise SystemExit(0)

    monkeypatch.setattr(connect_server.os, "execve", execve)
    with pytest.raises(SystemExit):
        connect_server.main(arguments)
    (submit,) = became
    return submit


def settings(submit: list[str]) -> dict[str, str]:
    return dict(submit[i + 1].split("=", 1) for i, arg in enumerate(submit) if arg == "--conf")


def test_the_connect_server_runs_the_compose_services_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours = container("spark-connect")
    theirs = compose_services()["spark-connect"]["command"]
    command = [arg.replace("$(POD_IP)", POD_IP) for arg in ours["command"]]
    assert (
        command[:4] == theirs[:4] == ["python", "-m", "cdc_airflow.local.connect_server", "--exec"]
    )
    k8s = spark_submit(command[3:], monkeypatch)
    compose = spark_submit(theirs[3:], monkeypatch)
    # The same program, master, jars and conf; only the address the executors call back differs.
    assert [a for a in k8s if a != "--conf" and "=" not in a] == [
        a for a in compose if a != "--conf" and "=" not in a
    ]
    ours_conf, theirs_conf = settings(k8s), settings(compose)
    assert ours_conf.pop("spark.driver.host") == POD_IP
    assert theirs_conf.pop("spark.driver.host") == "spark-connect"
    assert ours_conf == theirs_conf
    assert ours_conf["spark.scheduler.mode"] == "FAIR"
    assert ours_conf["spark.connect.grpc.binding.port"] == "15002"
    env = {item["name"]: item for item in ours["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    compose_env = compose_services()["spark-connect"]["environment"]
    assert env["SPARK_LOCAL_IP"]["value"] == compose_env["SPARK_LOCAL_IP"]


def test_the_master_and_workers_run_the_compose_commands_at_their_pod_ip() -> None:
    found = compose_services()

    def line(command: list[str]) -> str:
        return command[-1].replace("$$", "$")

    master = line(container("spark-master")["command"])
    assert master == line(found["spark-master"]["command"]).replace(
        "--host spark-master", "--host $(POD_IP)"
    )
    worker = line(container("spark-worker")["command"])
    assert worker == line(found["spark-worker-1"]["command"]) + " --host $(POD_IP)"
    assert named("Deployment", "spark-worker")["spec"]["replicas"] == 2


def test_the_connect_server_is_cluster_internal_and_ready_only_when_it_answers() -> None:
    for obj in objects():
        assert obj["kind"] != "Ingress"
        if obj["kind"] == "Service":
            assert obj["spec"].get("type", "ClusterIP") == "ClusterIP", obj["metadata"]["name"]
    server = container("spark-connect")
    (port,) = server["ports"]
    assert port == {"name": "grpc", "containerPort": 15002}
    probe = server["readinessProbe"]["exec"]["command"]
    assert probe == [*compose_services()["spark-connect"]["healthcheck"]["test"][1:]]
    assert probe[-1] == f"sc://127.0.0.1:{port['containerPort']}"
    assert server["livenessProbe"]["tcpSocket"]["port"] == "grpc"
    assert named("Deployment", "spark-connect")["spec"]["strategy"]["type"] == "Recreate"
    assert server["resources"]["requests"] and server["resources"]["limits"]["memory"]
    policy = named("NetworkPolicy", "spark-connect")["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "spark-connect"}
    airflow = [rule for rule in policy["ingress"] if "ports" in rule]
    assert [rule["ports"] for rule in airflow] == [[{"port": 15002, "protocol": "TCP"}]]


def test_no_secret_value_is_in_the_manifests() -> None:
    assert [o for o in objects() if o["kind"] == "Secret"] == []
    for name in ("spark-connect", "spark-worker"):
        refs = [source for source in container(name)["envFrom"] if "secretRef" in source]
        assert refs == [{"secretRef": {"name": "cdc-object-store", "optional": True}}]
