"""A headless Chromium (the Debian package's browser and driver) for the UI tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def chromium(profile: Path, *, width: int = 1600, height: int = 900) -> Any:
    """A Selenium driver of a new headless Chromium with its own profile folder (no network
    beyond what the page asks for; the caller quits it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def artifacts_folder(*parts: str) -> Path:
    """test-artifacts/<parts> in the checkout (created): screenshots kept for people to look at."""
    folder = Path(__file__).resolve().parents[2] / "test-artifacts"
    for part in parts:
        folder = folder / part
    folder.mkdir(parents=True, exist_ok=True)
    return folder
