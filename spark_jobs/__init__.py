"""The Spark steps: what a Spark driver (spark-submit) or a Spark Connect client runs.

One entry module per step (`stage`, `overwrite_final`, `optimize`, `vacuum`, `reset_staging`,
`as_of`, `check`) and what they share: reading landing files (`landing`, `formats`,
`csv_format`, `extracts`), the change rules (`transforms`, `history`), overwrite-final's parts
(`key_lookup`, `append_only`, `final_table`) and the Delta adapter (`delta`). Never imports
Airflow or the tools.
"""
