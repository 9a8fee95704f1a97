"""The project's wheel, built once for the install tests (tests/wheel_install/wheel_venv.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.wheel_install.wheel_venv import build_wheel


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel --no-deps` of a copy of the checkout; beside it, the copy (`source`)."""
    started = time.monotonic()
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    print(
        f"\nwheel built in {time.monotonic() - started:.1f} s ({wheel.stat().st_size // 1024} KiB)"
    )
    return wheel


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The lowest-Airflow install (3-6 min from the package index) runs with
    CDC_TEST_LOWEST_AIRFLOW=1 (`make test-lowest-airflow`); `make test` deselects it, CI's time
    budget cannot take it beside the rest."""
    if os.environ.get("CDC_TEST_LOWEST_AIRFLOW") == "1":
        return
    chosen = [item for item in items if item.get_closest_marker("lowest_airflow") is None]
    if len(chosen) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in chosen])
        items[:] = chosen
