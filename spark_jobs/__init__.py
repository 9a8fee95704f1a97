"""The Spark steps: what a Spark driver (spark-submit) or a Spark Connect client runs.

One entry module per step at the top (`stage`, `overwrite_final`, `optimize`, `vacuum`,
`reset_staging`, `as_of`, `check`: spark-submit runs them by file path), and what they share,
by role: `runtime` (arguments, context, report, failures, session, storage), `landing` (the
landing boundary and ledger), `formats` (the readers, one module per format), `staging` and
`overwrite` (the parts of stage and overwrite-final), `rules` (the change rules), `status` (what
the tools ask without Spark), `kafka` (a Kafka table's source) and `delta` (the Delta adapter).
Never imports Airflow or the tools.
"""
