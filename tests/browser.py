"""A real browser for the dashboard's tests: Debian's Chromium driven through its ChromeDriver
by Selenium, headless, with the flags that keep it off the network (no background requests,
no component updates). A missing browser skips a test, but with CI=true it fails: CI installs
`chromium` and `chromium-driver` (.ci/run)."""
from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = os.environ.get("SHADOW_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SHADOW_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1440,1100")


def missing(why: str):
    """Skip, or fail under CI=true (the browser tests must run in CI)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {why}: .ci/run installs Debian's chromium and "
                    "chromium-driver")
    pytest.skip(why)


def chromium(user_data_dir):
    """A headless Chromium (selenium.webdriver.Chrome) with a new empty profile."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium is not installed (pip install -e '.[test]')")
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(path)):
            missing(f"no {path} (apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={user_data_dir}"):
        opts.add_argument(flag)
    return webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
