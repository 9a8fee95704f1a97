"""The S3A settings the step sessions derive from the AWS environment variables."""

from __future__ import annotations

from spark_jobs.runtime.object_store import SCHEME_CONF, s3a_conf


def test_no_aws_variables_only_map_the_scheme() -> None:
    assert s3a_conf({}) == SCHEME_CONF


def test_an_http_endpoint_with_keys_is_path_style_without_tls() -> None:
    conf = s3a_conf(
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_REGION": "eu-west-1",
            "AWS_ACCESS_KEY_ID": "id",
            "AWS_SECRET_ACCESS_KEY": "secret",
        }
    )
    assert conf == {
        **SCHEME_CONF,
        "fs.s3a.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.endpoint.region": "eu-west-1",
        "fs.s3a.access.key": "id",
        "fs.s3a.secret.key": "secret",
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }


def test_a_session_token_uses_temporary_credentials_and_hosted_style_is_kept() -> None:
    conf = s3a_conf(
        {
            "AWS_ENDPOINT_URL_S3": "https://s3.example.com",
            "AWS_ENDPOINT_URL": "https://other.example.com",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true",
            "AWS_DEFAULT_REGION": "us-east-2",
            "AWS_ACCESS_KEY_ID": "id",
            "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_SESSION_TOKEN": "token",
        }
    )
    assert conf["fs.s3a.endpoint"] == "https://s3.example.com"
    assert conf["fs.s3a.connection.ssl.enabled"] == "true"
    assert conf["fs.s3a.path.style.access"] == "false"
    assert conf["fs.s3a.endpoint.region"] == "us-east-2"
    assert conf["fs.s3a.session.token"] == "token"
    assert conf["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")


def test_a_key_without_its_secret_leaves_s3a_to_its_default_chain() -> None:
    assert "fs.s3a.access.key" not in s3a_conf({"AWS_ACCESS_KEY_ID": "id"})
