"""The CDC tables view: an Airflow plugin (`plugin`) and the data it shows (`status`).

Read-only: it opens the tables' Delta logs and the metadata DB, never Spark, and never writes.
"""
