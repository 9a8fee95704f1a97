"""Object storage for Spark: `s3://` read and written through Hadoop's S3A (the jars `make install`
fetches), with the settings taken from the same AWS environment variables delta-rs reads.

One URI for both: delta-rs reads `s3://bucket/key` natively, and Spark maps the `s3` scheme to
S3A, so a table's location is one string for both sides. The settings are runtime settings of
the session (Hadoop reads a session's SQL settings when it opens a file system), applied by every
step's session, classic or Connect: the task's environment, not the server's, says where and as
whom, as it does for delta-rs on the driver side.

Credentials: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`) when set,
passed as S3A's own keys (Spark redacts them in its UI and logs); when unset, S3A's default chain
(instance profile, web identity, ...) applies. Never from the config file.

Hadoop caches a file system per bucket and user for the JVM's lifetime: on a shared Connect
server the first session that opens a bucket fixes the endpoint and credentials later sessions
get for it. One set of AWS settings per server (what a deployment has); a server whose tasks need
different ones needs `fs.s3a.impl.disable.cache=true` in its settings (a new client per read).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

SCHEME_CONF = {
    # Spark's `s3` scheme is S3A (Hadoop has no other s3 file system any more).
    "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
    "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    # Upload blocks buffered off-heap, not in local files: S3A's disk buffer takes Hadoop's local
    # file system as a LocalFileSystem, and the sessions make it the raw one (no checksum
    # sidecars: spark_jobs/runtime/session.py), which fails every write with a ClassCastException.
    # At most `fs.s3a.fast.upload.active.blocks` (4) blocks of `fs.s3a.multipart.size` per stream.
    "fs.s3a.fast.upload.buffer": "bytebuffer",
    "fs.s3a.multipart.size": "32M",
}


def _true(text: str | None) -> bool:
    return (text or "").strip().lower() in {"1", "true", "yes"}


def s3a_conf(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """S3A's settings from the AWS environment variables delta-rs (object_store) reads too:
    `AWS_ENDPOINT_URL` (an S3-compatible server; path-style requests unless
    `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`), `AWS_REGION` or `AWS_DEFAULT_REGION`, the keys."""
    env = os.environ if environ is None else environ
    conf = dict(SCHEME_CONF)
    endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "").strip()
    if endpoint:
        conf["fs.s3a.endpoint"] = endpoint
        conf["fs.s3a.connection.ssl.enabled"] = str(urlsplit(endpoint).scheme == "https").lower()
        hosted = _true(env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST"))
        conf["fs.s3a.path.style.access"] = str(not hosted).lower()
    region = (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "").strip()
    if region:
        conf["fs.s3a.endpoint.region"] = region
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        conf["fs.s3a.access.key"] = key
        conf["fs.s3a.secret.key"] = secret
        token = env.get("AWS_SESSION_TOKEN")
        if token:
            conf["fs.s3a.session.token"] = token
            conf["fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            )
        else:
            conf["fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            )
    return conf
