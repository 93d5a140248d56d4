"""Debian's headless Chromium through Playwright (no browser download), for the browser tests.

Chromium comes from ``scripts/setup.sh`` (``apt-get install chromium`` as root). Without it
the browser tests are skipped when not root (the reason says how to install it), and fail as
root, where setup should have installed it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("CHEXNET_CHROMIUM") or shutil.which("chromium")
                or "/usr/bin/chromium")  # the same lookup as scripts/setup.sh (PATH)


def require_chromium() -> None:
    """Skip (not root) or fail (root) the calling test when Chromium is missing."""
    if CHROMIUM.exists():
        return
    how = "sudo apt-get update && sudo apt-get install -y chromium"
    release = Path("/etc/os-release")
    if release.exists() and re.search(r"^ID=\"?ubuntu", release.read_text(), re.M):
        pytest.skip("browser check skipped: Ubuntu's chromium apt package is a snap shim "
                    "that `make setup` does not install; put a Chromium binary on PATH "
                    "or name it in CHEXNET_CHROMIUM")
    if os.geteuid() == 0:
        pytest.fail(f"{CHROMIUM} is missing although this is root: `make setup` installs it "
                    f"(or run: {how})")
    pytest.skip(f"browser check skipped: Debian chromium is not installed at {CHROMIUM} and "
                f"this is not root, so `make setup` could not install it; run: {how}")


@contextmanager
def headless_chromium() -> Iterator[object]:
    """A Playwright ``Browser`` on Debian's Chromium, closed (and Playwright stopped) after."""
    require_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:   # pinned in requirements/base.txt
        pytest.fail(f"playwright is not installed ({exc}); run `make setup`")
    pw = sync_playwright().start()
    try:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=["--disable-dev-shm-usage", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        pw.stop()
