"""The local launcher: Airflow on SQLite and a Spark Connect server, for one machine.

`make airflow`, `make demo` and the tests start Airflow through `launcher`; its executor
(`executor`) imports the task code before it forks; `home` is the one home `make airflow` and
`make demo` share, held by one of them at a time; `connect_server` starts and stops the
Spark Connect server (`connect_driver` is the server's driver program); `runs` reads the
metadata DB to follow runs. A managed Airflow never imports this package.
"""
