"""The core: what a config row means, and the plan that follows from it.

Config models and their validation, schedules, durations, intervals, table paths, the step
registry and the per-table DAG plan. Pure Python: no Spark, no Airflow, no delta-rs (`make lint`
checks this with import-linter), so `cdc validate` and DAG parsing stay cheap and testable alone.
"""

__version__ = "0.1.0"
