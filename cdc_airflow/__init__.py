"""The Airflow layer: one DAG per config row, and what runs around it.

DAG building and the step operator (`dags`), alerts, deadlines and assets (`operations`,
`alerts`), the CDC tables view's data (`table_status`), the local launcher (`local`: Airflow on
SQLite plus a Spark Connect server, `connect_server`) and the metadata-DB reader used to follow
runs (`runs`). It plans with `cdc_pipeline` and runs steps from `spark_jobs`; it never imports
the tools (`cdc_tools`).
"""
