"""The course's own site (#49): built from the notebooks just executed and opened page by page
in headless Chromium.

``make test`` runs this file at the end of its notebook stage, after every notebook, with
``CHEXNET_EXECUTED_DIR`` naming where the stage saved what nbval executed in this session
(``build/test/executed``: the repository's conftest.py empties it first), so nothing is
executed twice; ``make book-check`` runs it on what ``make tutorial`` executed
(``build/executed``). Elsewhere (``make test``'s first stage, a bare ``pytest tests``) it is
skipped: there is no executed course to build from.

The site goes to ``<that folder's parent>/book`` (``CHEXNET_BOOK_REPO_URL``: a repository
button, as ``make book REPO_URL=...``); the screenshots of the landing page and of notebook 04
to ``$CHEXNET_BROWSER_SHOTS`` (``build/browser/``), else the test's folder.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest

from chexnet_utils.notebook import results
from chexnet_utils.notebook.book import build_book, executed_notebooks
from chexnet_utils.notebook.run_record import recorded_run
from tests.support.chromium import headless_chromium
from tests.support.executed_notebooks import EXECUTED_ENV
from tests.support.site_browser import browse_site, serve

ROOT = Path(__file__).resolve().parents[2]
COURSE = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SEARCH_WORD, SEARCH_PAGE = "DistributedGradientTape", "04_distributed_training_horovod.html"
"""A word of notebook 04's lesson (Horovod's change 4) that the site's search must find there."""

pytestmark = pytest.mark.skipif(
    not os.environ.get(EXECUTED_ENV),
    reason=f"needs the executed course: {EXECUTED_ENV} (make test's notebook stage, make "
           "book-check)")


def test_the_course_site_builds_and_every_page_passes_in_chromium(tmp_path: Path):
    executed = Path(os.environ[EXECUTED_ENV]).resolve()
    have = [p.name for p in executed_notebooks(executed)]
    assert have == COURSE, f"{executed} should hold every executed notebook: {have}"
    unrecorded = [p.name for p in executed_notebooks(executed)
                  if not recorded_run(nbformat.read(p, as_version=4))]
    assert not unrecorded, f"executed without a record of where: {unrecorded}"
    out = executed.parent
    t0 = time.perf_counter()
    results_json = results.results_path()  # where the notebooks recorded (the work dir)
    site = build_book(executed, out, results_json=results_json if results_json.exists() else None,
                      repo_url=os.environ.get("CHEXNET_BOOK_REPO_URL") or None)
    build_s = time.perf_counter() - t0
    shot_dir = Path(os.environ.get("CHEXNET_BROWSER_SHOTS") or tmp_path)
    t0 = time.perf_counter()
    with headless_chromium() as chromium, serve(site) as base:
        report = browse_site(chromium, base, site, shots=("index", SEARCH_PAGE[:-5]),
                             shot_dir=shot_dir, search_word=SEARCH_WORD,
                             search_page=SEARCH_PAGE)
    print(f"\ncourse site: built in {build_s:.1f} s, {report['pages']} pages, "
          f"{report['images']} images, {report['links']} links checked in Chromium in "
          f"{time.perf_counter() - t0:.1f} s; screenshots in {shot_dir}")
    assert report["problems"] == []
    assert report["pages"] >= len(COURSE) + 2
    assert report["images"] >= len(COURSE)   # the figures: the course draws ~30
    assert report["details_checked"] >= 3    # the collapsed "deeper" blocks open
