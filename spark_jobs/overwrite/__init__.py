"""The parts of the overwrite-final step (spark_jobs/overwrite_final.py): key lookup, ranking,
append-only tables, final's partitions, absent columns, truncates, applied marks, the catalog,
history."""
