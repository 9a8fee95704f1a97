"""A Kafka table's client properties: from the environment, never the config; translated for
Spark's Java client."""

from __future__ import annotations

import pytest

from cdc_pipeline.errors import ConfigError
from cdc_pipeline.kafka_settings import (
    librdkafka_properties,
    properties_from_environment,
    require_bootstrap,
    spark_options,
)


def test_cdc_kafka_variables_are_client_properties() -> None:
    environ = {
        "CDC_KAFKA_BOOTSTRAP_SERVERS": "b1:9092,b2:9092",
        "CDC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "CDC_KAFKA_EMPTY": "",
        "KAFKA_OTHER": "x",
    }
    assert properties_from_environment(environ) == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "security.protocol": "SASL_SSL",
    }


def test_no_bootstrap_servers_is_a_config_error_naming_both_places() -> None:
    with pytest.raises(ConfigError, match=r"CDC_KAFKA_BOOTSTRAP_SERVERS.*'kafka_main'"):
        require_bootstrap({}, "orders", "kafka_main")


def test_sasl_user_and_password_become_the_java_clients_jaas_config() -> None:
    options = spark_options(
        {
            "bootstrap.servers": "b:9092",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "cdc",
            "sasl.password": 'p"w\\d',
            "ssl.ca.location": "/etc/ca.pem",
            "group.id": "ignored",
        }
    )
    assert options == {
        "kafka.bootstrap.servers": "b:9092",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.ssl.truststore.location": "/etc/ca.pem",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        'required username="cdc" password="p\\"w\\\\d";',
    }


def test_a_sasl_user_without_a_known_mechanism_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"sasl\.mechanism is GSSAPI"):
        spark_options({"sasl.username": "u", "sasl.mechanism": "GSSAPI"})


def test_java_only_properties_are_not_given_to_librdkafka() -> None:
    assert librdkafka_properties(
        {"bootstrap.servers": "b:1", "ssl.truststore.location": "x", "sasl.jaas.config": "y"}
    ) == {"bootstrap.servers": "b:1"}


def test_a_latest_start_without_columns_cannot_refuse_schema_changes() -> None:
    from cdc_pipeline.config.loader import parse_config

    row = {"name": "k", "source": "kafka", "topic": "t", "change_format": "debezium"}
    row.update(keys=["id"], starting_offsets="latest", on_schema_change="quarantine")
    problems = [str(p) for p in parse_config({"tables": [row]}).problems]
    assert problems == [
        "table k: on_schema_change: quarantine refuses the columns a starting_offsets: latest "
        "table learns from its first messages: declare columns, or use evolve"
    ]
