"""The `cdc_object_store` connection resolved by the amazon provider's AwsBaseHook into the AWS
variables the steps read, against moto's server (tests/s3.py) as both STS and S3: an assumed
role, web identity and a shared-credentials profile give working credentials; a connection that
does not exist gives none; a half-filled key pair fails once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException

from cdc_airflow.backends import object_store_environment
from tests.s3 import REGION

ROLE = "arn:aws:iam::123456789012:role/cdc-writer"
VARIABLE = "AIRFLOW_CONN_CDC_OBJECT_STORE"


@pytest.fixture(autouse=True)
def no_worker_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the connection speaks: no AWS variable or shared file of this machine."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_STS",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "absent-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def connect(monkeypatch: pytest.MonkeyPatch, **connection: Any) -> None:
    monkeypatch.setenv(VARIABLE, json.dumps({"conn_type": "aws", **connection}))


def usable(environment: dict[str, str], bucket: str) -> list[str]:
    """Write and list an object in `bucket` with these variables only, as a step would."""
    s3 = boto3.client(
        "s3",
        endpoint_url=environment["AWS_ENDPOINT_URL"],
        region_name=environment["AWS_REGION"],
        aws_access_key_id=environment["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=environment.get("AWS_SESSION_TOKEN"),
    )
    s3.put_object(Bucket=bucket, Key="probe/a.txt", Body=b"x")
    return [item["Key"] for item in s3.list_objects_v2(Bucket=bucket)["Contents"]]


def test_an_assumed_role_gives_the_roles_session_credentials_that_work(
    monkeypatch: pytest.MonkeyPatch, s3_server: Any
) -> None:
    """role_arn in the extra: the hook calls STS AssumeRole (moto's, through the `sts` entry of
    service_config, since assume-role never uses the global endpoint_url) with the login's keys,
    and the step gets the role's temporary credentials, not the login's."""
    endpoint = s3_server.endpoint
    connect(
        monkeypatch,
        login="AKIAEXAMPLELOGIN0001",
        password="login-secret",
        extra={
            "region_name": REGION,
            "endpoint_url": endpoint,
            "role_arn": ROLE,
            "assume_role_kwargs": {"RoleSessionName": "cdc-step"},
            "service_config": {"sts": {"endpoint_url": endpoint}},
        },
    )
    environment = object_store_environment()
    assert set(environment) == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ALLOW_HTTP",
    }
    assert environment["AWS_ACCESS_KEY_ID"] != "AKIAEXAMPLELOGIN0001"
    assert environment["AWS_ACCESS_KEY_ID"].startswith("ASIA")  # STS's temporary key ids
    assert environment["AWS_SECRET_ACCESS_KEY"] != "login-secret"
    assert environment["AWS_SESSION_TOKEN"]
    assert environment["AWS_ENDPOINT_URL"] == endpoint
    assert environment["AWS_REGION"] == REGION
    assert environment["AWS_ALLOW_HTTP"] == "true"
    # moto's STS knows the session it issued: the credentials are the role's.
    sts = boto3.client(
        "sts",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=environment["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=environment["AWS_SESSION_TOKEN"],
    )
    assert sts.get_caller_identity()["Arn"] == (
        "arn:aws:sts::123456789012:assumed-role/cdc-writer/cdc-step"
    )
    bucket = s3_server.create_bucket()
    assert usable(environment, bucket) == ["probe/a.txt"]


def test_web_identity_assumes_the_role_with_the_token_file(
    monkeypatch: pytest.MonkeyPatch, s3_server: Any, tmp_path: Path
) -> None:
    """assume_role_method assume_role_with_web_identity: no key pair at all, the token file's
    token exchanged at STS for the role's credentials (as on EKS with IRSA)."""
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJjZGMifQ.c2lnbmF0dXJl")
    endpoint = s3_server.endpoint
    connect(
        monkeypatch,
        extra={
            "region_name": REGION,
            "endpoint_url": endpoint,
            "role_arn": ROLE,
            "assume_role_method": "assume_role_with_web_identity",
            "assume_role_with_web_identity_federation": "file",
            "assume_role_with_web_identity_token_file": str(token),
            "service_config": {"sts": {"endpoint_url": endpoint}},
        },
    )
    environment = object_store_environment()
    assert environment["AWS_ACCESS_KEY_ID"].startswith("ASIA")
    assert environment["AWS_SESSION_TOKEN"]
    assert usable(environment, s3_server.create_bucket()) == ["probe/a.txt"]


def test_a_profile_gives_its_credentials(
    monkeypatch: pytest.MonkeyPatch, s3_server: Any, tmp_path: Path
) -> None:
    """profile_name in the extra: the profile of the worker's shared credentials file."""
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[cdc]\naws_access_key_id = AKIAPROFILE000000001\naws_secret_access_key = p-secret\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    connect(
        monkeypatch,
        extra={"region_name": REGION, "endpoint_url": s3_server.endpoint, "profile_name": "cdc"},
    )
    environment = object_store_environment()
    assert environment == {
        "AWS_ACCESS_KEY_ID": "AKIAPROFILE000000001",
        "AWS_SECRET_ACCESS_KEY": "p-secret",
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ALLOW_HTTP": "true",
    }
    assert usable(environment, s3_server.create_bucket()) == ["probe/a.txt"]
    # A profile the worker does not have is a mistake a retry cannot mend.
    connect(monkeypatch, extra={"profile_name": "nowhere"})
    with pytest.raises(AirflowFailException, match=r"connection 'cdc_object_store'.*nowhere"):
        object_store_environment()


def test_a_plain_key_pair_no_connection_and_a_half_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """The behaviours from before the hook: the key pair (and session token) as given, no STS
    call; an endpoint or a region alone leaves the credentials to the worker; no connection,
    nothing; a key id without its secret fails once."""
    connect(
        monkeypatch,
        login="key",
        password="secret",
        extra={
            "endpoint_url": "https://s3.example.test",
            "region_name": "eu-west-1",
            "aws_session_token": "tok",
        },
    )
    assert object_store_environment() == {
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "tok",
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "https://s3.example.test",
    }
    connect(monkeypatch, extra={"endpoint_url": "http://minio:9000"})
    assert object_store_environment() == {
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_ALLOW_HTTP": "true",
    }
    connect(monkeypatch, extra={"service_config": {"s3": {"endpoint_url": "http://minio:9000"}}})
    assert object_store_environment()["AWS_ENDPOINT_URL"] == "http://minio:9000"
    monkeypatch.delenv(VARIABLE)
    assert object_store_environment() == {}
    connect(monkeypatch, login="AKIA1")
    with pytest.raises(AirflowFailException, match="connection 'cdc_object_store': set both"):
        object_store_environment()
    connect(monkeypatch, password="secret")
    with pytest.raises(AirflowFailException, match="connection 'cdc_object_store': set both"):
        object_store_environment()
