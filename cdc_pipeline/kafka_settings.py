"""Where a Kafka table's broker is and how to reach it: client properties, never in the config.

The properties are Kafka's own names in librdkafka's dialect (`bootstrap.servers`,
`security.protocol`, `sasl.mechanism`, `sasl.username`, `ssl.ca.location`, ...), the dialect of
the Airflow Kafka provider's connection extra. The `cdc` command reads them from the
environment: `CDC_KAFKA_BOOTSTRAP_SERVERS` and any `CDC_KAFKA_<PROPERTY>` (upper case, dots as
underscores: `CDC_KAFKA_SASL_MECHANISM` is `sasl.mechanism`). Spark's Kafka source runs the
Java client, whose SASL and TLS settings are named differently: `spark_options` translates.
"""

from __future__ import annotations

from collections.abc import Mapping

from cdc_pipeline.errors import ConfigError

ENV_PREFIX = "CDC_KAFKA_"
BOOTSTRAP = "bootstrap.servers"

# librdkafka properties the Java client knows by another name (or builds from several).
_JAVA_NAMES = {
    "sasl.mechanisms": "sasl.mechanism",
    "ssl.ca.location": "ssl.truststore.location",
    "ssl.certificate.location": "ssl.keystore.certificate.chain",
    "ssl.key.location": "ssl.keystore.key",
}
# Consumer properties the batch read sets itself (Spark refuses them as options).
_SPARK_OWNED = {
    "group.id",
    "auto.offset.reset",
    "enable.auto.commit",
    "key.deserializer",
    "value.deserializer",
    "interceptor.classes",
}
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def properties_from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The client properties `CDC_KAFKA_*` variables set (`bootstrap.servers` among them)."""
    return {
        name[len(ENV_PREFIX) :].lower().replace("_", "."): value
        for name, value in environ.items()
        if name.startswith(ENV_PREFIX) and value != ""
    }


def require_bootstrap(properties: Mapping[str, str], table: str, conn_id: str) -> str:
    """The bootstrap servers, or a ConfigError saying where they are set."""
    servers = properties.get(BOOTSTRAP, "").strip()
    if not servers:
        raise ConfigError(
            f"table {table}: no Kafka bootstrap servers: set CDC_KAFKA_BOOTSTRAP_SERVERS (the "
            f"`cdc` command) or the Airflow connection {conn_id!r} (its extra "
            '{"bootstrap.servers": "host:9092"})'
        )
    return servers


def spark_options(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties as Spark Kafka source options (`kafka.` + the Java client's names)."""
    java: dict[str, str] = {}
    for name, value in properties.items():
        if name in _SPARK_OWNED or name in ("sasl.username", "sasl.password"):
            continue
        java[_JAVA_NAMES.get(name, name)] = value
    if "ssl.truststore.location" in java:
        java.setdefault("ssl.truststore.type", "PEM")
    if "ssl.keystore.key" in java:
        java.setdefault("ssl.keystore.type", "PEM")
    mechanism = java.get("sasl.mechanism", "").upper()
    if "sasl.username" in properties and "sasl.jaas.config" not in java:
        module = _LOGIN_MODULES.get(mechanism)
        if module is None:
            raise ConfigError(
                f"Kafka: sasl.username is set but sasl.mechanism is {mechanism or 'unset'}: "
                f"set sasl.mechanism to one of {', '.join(_LOGIN_MODULES)}, or give "
                "sasl.jaas.config"
            )
        username = _jaas_quoted(properties["sasl.username"])
        password = _jaas_quoted(properties.get("sasl.password", ""))
        java["sasl.jaas.config"] = f'{module} required username="{username}" password="{password}";'
    return {f"kafka.{name}": value for name, value in java.items()}


def _jaas_quoted(value: str) -> str:
    """A value inside a JAAS config's double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


# Java client properties for Spark's read only (librdkafka refuses or ignores them):
# `default.api.timeout.ms` bounds each of the source's admin calls (3 tries) when the broker
# stops answering mid-read (Java's default: 60 s each); it may not be below
# `request.timeout.ms` (30 s by default), so a shorter bound sets both.
_JAVA_ONLY = {"sasl.jaas.config", "default.api.timeout.ms", "request.timeout.ms"}


def librdkafka_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties as the Python client (librdkafka) takes them: Java-only names dropped."""
    return {
        name: value
        for name, value in properties.items()
        if not name.startswith(("ssl.truststore.", "ssl.keystore.")) and name not in _JAVA_ONLY
    }
