"""The Airflow layer: one DAG per config row, and what runs around it.

What a worker imports sits at the top: the DAG builder (`dags`), the step operator
(`operator`), where a step runs (`backends`), deadlines, pools, assets and the quarantine gate
(`operations`, `alerts`), metrics and lineage. `view/` is the CDC tables view (an Airflow
plugin) and its data; `local/` the local launcher (Airflow on SQLite plus a Spark Connect
server) and the metadata-DB reader used to follow runs. Neither is imported by a task. It plans
with `cdc_pipeline` and runs steps from `spark_jobs`; it never imports the tools (`cdc_tools`).
"""
