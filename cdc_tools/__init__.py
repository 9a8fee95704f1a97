"""The tools people run by hand: the `cdc` CLI, the demo, the change generator and the benchmarks.

Nothing here runs inside a Spark driver or an Airflow task; the benchmarks' plotting library
(matplotlib) is an optional extra (`pip install -e '.[bench]'`, part of `make install`).
"""
