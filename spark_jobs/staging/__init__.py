"""The parts of the stage step (spark_jobs/stage.py): plan, readers, rows, recovery, commits,
ledger, notices."""
