"""The change rules: typing and quarantine, ranking (`transforms`), and the check of the config's
SQL expressions on Spark's analysed plan (`expression_check`)."""
