"""The project's wheel, built once for the install tests (tests/wheel_install/wheel_venv.py)."""

from __future__ import annotations

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
