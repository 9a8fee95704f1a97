"""Which drivers get the folder that keeps YARN's Hadoop defaults out (driver_classpath), and
that a user's own driver classpath stays as it is beside it."""

from __future__ import annotations

from cdc_airflow.local import connect_server
from spark_jobs.runtime.session import HADOOP_DEFAULTS_DIR, driver_classpath

KEY = "spark.driver.defaultExtraClassPath"  # Spark's launcher: after extraClassPath


def test_every_master_but_yarn_gets_the_folder_with_an_empty_yarn_default() -> None:
    for master in ("local[2]", "local[*]", "local", "spark://spark-master:7077", "k8s://h:443"):
        assert driver_classpath(master) == {KEY: str(HADOOP_DEFAULTS_DIR)}, master
    for master in ("yarn", "YARN", " yarn-client"):
        assert driver_classpath(master) == {}, master  # YARN's client reads its defaults
    assert driver_classpath(None) == {}  # under spark-submit: its own command line decides
    empty = (HADOOP_DEFAULTS_DIR / "yarn-default.xml").read_text()
    assert "<configuration>\n</configuration>" in empty and "<property>" not in empty


def test_the_connect_server_gets_the_folder_and_a_users_own_classpath_stays() -> None:
    assert connect_server.server_conf(15002)[KEY] == str(HADOOP_DEFAULTS_DIR)
    theirs = connect_server.server_conf(15002, {"spark.driver.extraClassPath": "/opt/extra"})
    assert theirs["spark.driver.extraClassPath"] == "/opt/extra"
    assert theirs[KEY] == str(HADOOP_DEFAULTS_DIR)
    assert KEY not in connect_server.server_conf(15002, master="yarn")
    command, _ = connect_server.server_command(15002, "spark://m:7077")
    assert f"{KEY}={HADOOP_DEFAULTS_DIR}" in command
