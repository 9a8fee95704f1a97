"""What the DAG files hold, in the package: each DAGs-folder file is one `import *` line.

`tables` gives one DAG `cdc_<name>` per valid row of the config table; `config_errors` turns the
invalid rows into that file's import error (a file of its own, so the valid DAGs keep loading):

    # <dags folder>/cdc_tables.py
    from cdc_airflow.dag_files.tables import *
    # <dags folder>/cdc_config_errors.py
    from cdc_airflow.dag_files.config_errors import *

Each `import *` builds afresh: a module's body runs once per process, so the work happens in
the module's `__getattr__("__all__")` (PEP 562), which every `import *` asks for. A process that
parses the folder again (the DAG processor, a test's DagBag) reads the config table again.
"""

from __future__ import annotations

from pathlib import Path

# The DAG files of a DAGs folder, by file name: what `write_dag_files` writes (the local launcher
# does, when the package runs installed rather than from a checkout's dags/).
DAG_FILES = {
    "cdc_tables.py": '"""One DAG per valid CDC config row."""\n\n'
    "from cdc_airflow.dag_files.tables import *  # noqa: F403\n",
    "cdc_config_errors.py": '"""Invalid CDC config rows as this file\'s import error."""\n\n'
    "from cdc_airflow.dag_files.config_errors import *  # noqa: F403\n",
}


def write_dag_files(folder: Path) -> None:
    """Write the DAG files into `folder` (created), replacing any of the same names."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in DAG_FILES.items():
        (folder / name).write_text(text)
