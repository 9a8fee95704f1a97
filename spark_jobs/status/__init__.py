"""What the Airflow layer and the tools ask of a table before or beside its runs, without Spark:
freshness by data, health facts, whether an interval has work."""
