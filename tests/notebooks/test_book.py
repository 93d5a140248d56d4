"""``make book`` on a small course made here (two executed notebooks, a README, a script): the
site builds, every page passes the browser check, and a broken link or a missing figure,
made on purpose, fails the build or the check (#49).

The course's own site is built and checked at the end of ``make test``'s notebook stage from
what nbval executed: test_course_site.py.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from chexnet_utils.notebook.book import build_book, conf_py, widget_text
from chexnet_utils.notebook.run_record import run_record, stamp
from chexnet_utils.notebook.site_check import is_remote, site_problems
from tests.support.chromium import headless_chromium
from tests.support.site_browser import browse_site, serve

WORD = "zebrafinch"   # only on the second page: the search must find it there


def text_of(page: Path) -> str:
    """A page's text: tags dropped, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text())).split())


def png_bytes() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (40, 20), (200, 40, 40)).save(buffer, format="PNG")
    return buffer.getvalue()


def make_course(root: Path, *, first_extra: str = "") -> Path:
    """A repository with a README, a script and two executed, stamped notebooks in
    ``root/build/executed``; return that folder."""
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "train.py").write_text("print('train')\n")
    (root / "README.md").write_text("# course\n\nWhat you learn, **for whom**.\n\n## Start\n")
    (root / "notebooks").mkdir()
    executed = root / "build" / "executed"
    executed.mkdir(parents=True)
    figure = new_output("display_data", data={
        "image/png": base64.b64encode(png_bytes()).decode(), "text/plain": "<Figure>"})
    bar = new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "box", "version_major": 2,
                                                     "version_minor": 0},
        "text/plain": "  0%|          | 0/4"})
    table = new_output("display_data", data={  # what chexnet_utils.notebook.tables displays
        "text/markdown": "| pipeline | images/s |\n|:---|---:|\n| old | 100 |\n| new | 196 |",
        "text/plain": "<IPython.core.display.Markdown object>"})
    first = new_notebook(cells=[
        new_markdown_cell("# 00 · First page\n\nWhat you will learn.\n\n<details><summary>"
                          "Deeper: the detail</summary>\n\nHidden until opened.\n\n</details>\n"
                          "\nNext: [the second page](01_second.ipynb); the script "
                          "[train.py](../scripts/train.py)." + first_extra),
        new_code_cell("plot()", outputs=[figure], execution_count=1),
        new_markdown_cell("## A section\n\nMore text.")])
    second = new_notebook(cells=[
        new_markdown_cell(f"# 01 · Second page\n\nThe word {WORD} is only here."),
        new_code_cell("bar()", outputs=[bar], execution_count=1),
        new_code_cell("table()", outputs=[table], execution_count=2)])
    second.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
        "box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_a", "IPY_MODEL_b",
                                                                  "IPY_MODEL_c"]}},
        "a": {"model_name": "HTMLModel", "state": {"value": "epochs: 100%"}},
        "b": {"model_name": "FloatProgressModel", "state": {"value": 4, "max": 4}},
        "c": {"model_name": "HTMLModel", "state": {"value": "4/4 [00:02&lt;00:00]"}}}}}
    for name, nb in [("00_first.ipynb", first), ("01_second.ipynb", second)]:
        nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}
        nb.metadata.language_info = {"name": "python"}
        stamp(nb, run_record("the test"))
        nbformat.write(nb, executed / name)
        clean = nbformat.from_dict(json.loads(json.dumps(nb)))
        for cell in clean.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nbformat.write(clean, root / "notebooks" / name)
    (root / "build" / "results.json").write_text(json.dumps({"00_first": {"speed-up": 2.5}}))
    return executed


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_course(tmp_path_factory.mktemp("course"))


@pytest.fixture(scope="module")
def site(course: Path) -> Path:
    root = course.parents[1]
    return build_book(course, root / "build", results_json=root / "build" / "results.json",
                      root=root)


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    with headless_chromium() as browser:
        yield browser


# --- without a browser ---------------------------------------------------------------------

def test_the_site_has_a_landing_page_every_notebook_and_search(site: Path):
    names = {p.name for p in site.glob("*.html")}
    assert {"index.html", "00_first.html", "01_second.html", "run-it-yourself.html",
            "search.html"} <= names
    assert (site / "searchindex.js").is_file()
    index = text_of(site / "index.html")
    assert "What you learn" in index and "speed-up" in index      # README opening, results
    assert "make tutorial" in index and "make lab" in index        # the two commands
    assert site_problems(site) == []


def test_each_page_says_where_its_numbers_were_measured(site: Path):
    page = text_of(site / "00_first.html")
    assert "Measured on" in page and "CPU cores" in page and "no GPU" in page
    assert "scale preset" in page and "the test" in page
    assert "run-it-yourself.html" in (site / "00_first.html").read_text()
    # the notebook as committed (a download) and the repository script the page links to
    downloads = {p.name for p in (site / "_downloads").rglob("*") if p.is_file()}
    assert {"00_first.ipynb", "train.py"} <= downloads


def test_figures_are_files_tables_render_and_progress_bars_are_their_final_text(site: Path):
    page = (site / "00_first.html").read_text()
    assert "<img" in page and list((site / "_images").glob("*.png"))
    bar = "\u2588" * 10
    assert f"epochs: 100% |{bar}| 4/4 [00:02<00:00]" in text_of(site / "01_second.html")
    assert "<table" in (site / "01_second.html").read_text()   # a table output, rendered


def test_widget_text_of_a_progress_bar_and_of_an_unknown_widget():
    state = {"state": {"w": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_p"]}},
                       "p": {"model_name": "FloatProgressModel", "state": {"value": 1, "max": 5}}}}
    assert widget_text({"model_id": "w"}, state) == "|\u2588\u2588        |"  # 1/5 of 10
    assert widget_text({"model_id": "gone"}, state) is None


def test_nothing_is_loaded_from_a_cdn():
    conf = conf_py("t", None)
    assert "nb_ipywidgets_js = {}" in conf and "nb_execution_mode = 'off'" in conf
    assert is_remote("https://cdn.example/x.js") and is_remote("//cdn.example/x.js")
    assert not is_remote("_static/x.js") and not is_remote("data:image/png;base64,AA")


def test_a_link_to_no_page_fails_the_build(tmp_path: Path):
    executed = make_course(tmp_path, first_extra=" Also [gone](07_missing.ipynb).")
    with pytest.raises(RuntimeError, match="07_missing"):
        build_book(executed, tmp_path / "build", root=tmp_path)


def test_a_broken_link_or_missing_figure_in_raw_html_fails_the_build(tmp_path: Path):
    executed = make_course(tmp_path, first_extra='\n\n<a href="gone.html">gone</a> '
                                                 '<img src="_images/none.png">\n')
    with pytest.raises(RuntimeError) as failed:
        build_book(executed, tmp_path / "build", root=tmp_path)
    assert "gone.html points to a missing file" in str(failed.value)
    assert "_images/none.png is missing or empty" in str(failed.value)


def test_a_figure_lost_after_the_build_and_an_outside_script_are_found(site: Path,
                                                                       tmp_path: Path):
    broken = tmp_path / "site"
    shutil.copytree(site, broken)
    lost = next((broken / "_images").glob("*.png"))
    lost.unlink()
    page = broken / "01_second.html"
    page.write_text(page.read_text().replace(
        "</head>", '<script src="https://cdn.example/x.js"></script></head>'))
    problems = site_problems(broken)
    assert any(lost.name in p and p.startswith("00_first.html") for p in problems), problems
    assert "01_second.html: loads https://cdn.example/x.js from another host" in problems


def test_make_book_without_executed_notebooks_says_what_to_run(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "chexnet_utils", "book", "--executed",
                           str(tmp_path / "none"), "--out", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "no executed notebook" in done.stderr and "make tutorial" in done.stderr


# --- in the browser ------------------------------------------------------------------------

def test_every_page_passes_the_browser_check(site: Path, chromium: object, tmp_path: Path):
    with serve(site) as base:
        report = browse_site(chromium, base, site, shots=("index",), shot_dir=tmp_path,
                             search_word=WORD, search_page="01_second.html")
    assert report["problems"] == []
    assert report["pages"] >= 5 and report["images"] >= 1 and report["details_checked"] >= 1
    assert any(h.endswith("01_second.html") for h in report["search_hits"])
    assert (tmp_path / "book-index.png").stat().st_size > 10_000


def test_the_browser_check_finds_a_missing_figure_and_a_broken_link(site: Path,
                                                                  chromium: object,
                                                                  tmp_path: Path):
    broken = tmp_path / "site"
    shutil.copytree(site, broken)
    next((broken / "_images").glob("*.png")).unlink()
    page = broken / "01_second.html"
    page.write_text(page.read_text().replace("The word", '<a href="gone.html">gone</a> The word'))
    with serve(broken) as base:
        problems = browse_site(chromium, base, broken)["problems"]
    assert any(p.startswith("00_first.html: image") for p in problems), problems
    assert any("01_second.html: link" in p and "gone.html answers HTTP 404" in p
               for p in problems), problems
