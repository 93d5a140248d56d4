"""``make book``: the executed course as a static site, readable without running anything.

Built with Sphinx, MyST-NB and sphinx-book-theme (the engine of Jupyter Book 1; pinned in
requirements/base.txt) from notebooks that were **already executed**, by ``make tutorial``
(``build/executed/``) or by ``make test``'s notebook stage (which saves what nbval ran:
the repository's conftest.py), so nothing is run twice: MyST-NB's execution is off.

:func:`build_book` makes a Sphinx project in ``<out>/book-src`` and the site in
``<out>/book``:

- a landing page: the README's opening (what you learn, for whom), the machine the numbers
  were measured on, the two commands, the results table of ``results.json``, the contents;
- each notebook as a page, in order, with a "Measured on" box under its title (cores, CPU,
  GPU or none, scale preset, date, which command ran it: written into the notebook's
  metadata when it ran, :mod:`chexnet_utils.notebook.run_record`), links to the notebook as
  committed and to "run it yourself";
- links to repository files (``../scripts/x.py``) turned into downloads inside the site.

Nothing is fetched at build or view time: the theme's assets come from the installed
packages, MyST-NB's widget scripts (a CDN) are switched off and progress-bar widgets are
shown as the text of their final state. :func:`chexnet_utils.notebook.site_check.site_problems`
then checks the result (links, figures, outside requests) and a failing check fails the build.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chexnet_utils.config import repo_root
from chexnet_utils.notebook import results
from chexnet_utils.notebook.run_record import describe_run, describe_runs, recorded_run
from chexnet_utils.notebook.site_check import site_problems
from chexnet_utils.platform.atomic import write_text_atomic
from chexnet_utils.platform.lazy import lazy_module
from chexnet_utils.platform.markdown import markdown_table

# nbformat: imported on first use (chexnet_utils.platform.lazy)
nbformat = lazy_module("nbformat")

SOURCE_DIR = "book-src"
SITE_DIR = "book"
LOG_NAME = "book.log"
REPO_FILES = "_repo"
"""Folder of the Sphinx project holding repository files the pages link to (downloads)."""
RUN_PAGE = "run-it-yourself"
BAR_WIDTH = 10
PROGRESS_MODELS = ("FloatProgressModel", "IntProgressModel")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_NOTEBOOK = re.compile(r"^\d\d_.*\.ipynb$")
_LOCAL_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\((?![a-z]+:)[^)]*\)")
_REPO_LINK = re.compile(r"\]\(\.\./([^)\s#]+)(#[^)\s]*)?\)")


# --- the Sphinx project ----------------------------------------------------------------------

def conf_py(title: str, repo_url: str | None) -> str:
    """The project's ``conf.py``: MyST-NB without execution, the book theme, nothing remote."""
    options: dict[str, Any] = {
        "home_page_in_toc": True, "show_toc_level": 2, "use_download_button": True,
        "use_fullscreen_button": False,
    }
    if repo_url:
        options.update(repository_url=repo_url, use_repository_button=True,
                       path_to_docs="notebooks")
    settings: dict[str, Any] = {
        "project": title,
        "author": "chexnet-at-scale",
        "extensions": ["myst_nb"],
        "nb_execution_mode": "off",        # executed already: make tutorial or make test
        "nb_ipywidgets_js": {},            # no require.js / widget manager from a CDN
        "nb_merge_streams": True,
        "nb_render_markdown_format": "myst",  # tables in text/markdown outputs (the table helper)
        # LaTeX outputs as their text: math would add MathJax from a CDN (sphinx.ext.mathjax)
        "nb_mime_priority_overrides": [["html", "text/latex", None]],
        "myst_enable_extensions": ["colon_fence"],
        "myst_heading_anchors": 3,
        "exclude_patterns": [f"{REPO_FILES}/**", "_build", "**.ipynb_checkpoints"],
        "html_theme": "sphinx_book_theme",
        "html_title": title,
        "html_theme_options": options,
        "html_context": {"default_mode": "light"},
        "html_favicon": "_static/favicon.svg",   # else the browser asks for /favicon.ico: a 404
        "html_static_path": ["_static"],
        "html_copy_source": True,          # the theme's download button: the executed .ipynb
        "suppress_warnings": ["myst.header", "misc.highlighting_failure"],
    }
    return "# Written by chexnet_utils.notebook.book; rebuilt on every make book.\n" + "".join(
        f"{key} = {value!r}\n" for key, value in settings.items())


def widget_text(view: Mapping[str, Any], state: Mapping[str, Any]) -> str | None:
    """The text of a tqdm progress bar's final state (its HBox: label, bar, counts), e.g.
    ``epochs: 100% |██████████| 4/4 [00:02<00:00]``, or
    ``None`` when its state was not saved (nbval, for one, drops the widget messages) or the
    widget is not one."""
    models = state.get("state", {})
    box = models.get(view.get("model_id", ""), {}).get("state", {})
    parts = []
    for ref in box.get("children", []):
        child = models.get(str(ref).removeprefix("IPY_MODEL_"), {})
        s = child.get("state", {})
        if child.get("model_name") in PROGRESS_MODELS:  # tqdm's label has the percent
            total = s.get("max") or 0
            filled = round(BAR_WIDTH * min(1.0, (s.get("value") or 0) / total)) if total else 0
            parts.append("|" + "\u2588" * filled + " " * (BAR_WIDTH - filled) + "|")
        elif "value" in s:
            parts.append(html.unescape(re.sub(r"<[^>]+>", "", str(s["value"]))))
    text = " ".join(p.strip() for p in parts if p.strip())
    return text or None


def widgets_as_text(nb: Any) -> None:
    """Progress-bar widgets as the text of their final state; a widget whose state the run did
    not save is dropped (its text fallback is the bar as first drawn: ``0%``)."""
    state = nb.metadata.pop("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    for cell in nb.cells:
        kept = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                text = widget_text(data.pop(WIDGET_VIEW), state)
                data.pop("text/plain", None)
                if text:
                    data["text/plain"] = text
                if not data:
                    continue
            kept.append(out)
        if cell.cell_type == "code":
            cell.outputs = kept


def where_it_stopped(nb: Any) -> str | None:
    """Why the run of ``nb`` did not finish (``None``: it did): the first error output, or the
    first code cell left unexecuted after an executed one (a timeout, an interrupted run)."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    for n, cell in enumerate(code):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"code cell {n + 1} raised {out.get('ename')}: {out.get('evalue')}"
    ran = [c.get("execution_count") is not None for c in code]
    if any(ran) and not all(ran[ran.index(True):]):
        first = ran.index(True) + ran[ran.index(True):].index(False)
        return f"code cells from {first + 1} on were not executed"
    return None


def prepare_notebook(nb: Any, name: str, *, clean_name: str) -> list[str]:
    """Ready an executed notebook for its page: the "Measured on" box after the title cell
    (and a warning box when its run did not finish), progress bars as text, links to
    repository files as downloads from :data:`REPO_FILES`; return those files' repository
    paths (for the project to copy)."""
    widgets_as_text(nb)
    linked: list[str] = []

    def to_download(m: re.Match[str]) -> str:
        linked.append(m.group(1))
        return f"]({REPO_FILES}/{m.group(1)})"

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _REPO_LINK.sub(to_download, cell.source)
    boxes = [
        ":::{admonition} Measured on\n:class: note\n"
        f"The outputs, numbers and figures on this page are from one run: "
        f"{describe_run(recorded_run(nb))}. On a GPU node, or at another scale, they differ: "
        f"[run it yourself]({RUN_PAGE}.md).\n\n"
        f"The notebook as committed (outputs cleared but those nbval checks): "
        f"{{download}}`{name} <{clean_name}>`.\n:::"]
    stopped = where_it_stopped(nb)
    if stopped:
        boxes.append(f":::{{admonition}} This run did not finish\n:class: warning\n{stopped}; "
                     "the outputs after it are missing or from the failure.\n:::")
    title = next((i for i, c in enumerate(nb.cells)
                  if c.cell_type == "markdown" and c.source.lstrip().startswith("# ")), None)
    if title is None:  # a page needs a title: the navigation and the browser check read it
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(f"# {Path(name).stem}"))
        title = 0
    for box in reversed(boxes):
        nb.cells.insert(title + 1, nbformat.v4.new_markdown_cell(box))
    return linked


def readme_opening(readme: Path) -> str:
    """The README's text between its title and its first ``## `` section (its links to its own
    sections and to repository files as plain text)."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    body = []
    for line in lines[1:]:
        if line.startswith("## "):
            break
        body.append(line)
    # links into the README itself or to repository files mean nothing on the site: their text
    return _LOCAL_LINK.sub(r"\1", "\n".join(body)).strip()


def results_markdown(data: Mapping[str, Mapping[str, Any]]) -> str:
    """The results of ``results.json`` as a markdown table (as ``make tutorial`` prints it)."""
    rows = results.table_rows(data)
    if not rows:
        return "_No results recorded: run `make tutorial` before `make book`._"
    return markdown_table(rows, columns=["notebook", "figure", "value"])


def index_page(title: str, opening: str, pages: Sequence[str], records: Sequence[Any],
               data: Mapping[str, Mapping[str, Any]]) -> str:
    """The landing page (MyST markdown)."""
    runs = describe_runs(records)
    where = ("All pages were executed on " + runs[0] + "." if len(runs) == 1 else
             "The pages were executed on more than one machine or by more than one command "
             "(each page names its own):\n\n" + "\n".join(f"- {m}" for m in runs))
    if not any(r and r.get("gpus") for r in records):
        where += ("\n\nNo GPU took part: these are CPU figures, not a GPU node's (the notebooks "
                  "say which of their figures need one).")
    toc = "\n".join([*pages, RUN_PAGE])
    return f"""# {title}

{opening}

:::{{admonition}} Where these numbers come from
:class: important
{where}
:::

## Run it yourself: two commands

```bash
make tutorial   # sets up everything, makes the sample data, runs every notebook headless
make test       # unit tests + every notebook under nbval + the browser checks (what CI runs)
```

Then learn interactively: `make lab` (JupyterLab with the project kernel and MPI engines).

`make book` rebuilds this site from the executed notebooks ([more](run-it-yourself.md)).

## Results of this run

{results_markdown(data)}

## Contents

```{{toctree}}
:maxdepth: 1
:caption: The course

{toc}
```
"""


FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" '
           'height="16" rx="3" fill="#1f4e79"/><path d="M5 4v8M11 4v8M5 8h6" stroke="#fff" '
           'stroke-width="2"/></svg>\n')
"""The site's icon (a white H on blue): without one Chromium asks for ``/favicon.ico``."""

RUN_TEXT = """# Run it yourself

Every number in this site was measured on the machine each page names. To measure them on
yours (a laptop runs the whole course on CPU in minutes; a GPU node runs it unchanged):

```bash
git clone <this repository> && cd chexnet-at-scale
make tutorial   # set up, make the sample data, run every notebook, print the results
make lab        # JupyterLab with the project kernel and the MPI engines' profile
make book       # this site, from the notebooks make tutorial executed (build/book/index.html)
```

`CHEXNET_SCALE=small` or `full` runs bigger presets; `CHEXNET_DATA_DIR` points the course at
the real NIH ChestX-ray14 data. The README says more: what to install first, the
distributions and Python versions, GPU nodes and clusters.
"""


def write_project(executed: Sequence[Path], src: Path, *, title: str,
                  data: Mapping[str, Mapping[str, Any]], repo_url: str | None,
                  root: Path) -> None:
    """Make the Sphinx project in ``src`` (emptied first) from the ``executed`` notebooks."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    records, pages = [], []
    for path in executed:
        nb = nbformat.read(path, as_version=4)
        records.append(recorded_run(nb))
        clean_name = f"{REPO_FILES}/notebooks/{path.name}"
        linked = prepare_notebook(nb, path.name, clean_name=clean_name)
        for rel in [f"notebooks/{path.name}", *linked]:  # a missing one: Sphinx's -W says so
            if (root / rel).is_file():
                (src / REPO_FILES / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, src / REPO_FILES / rel)
        nbformat.write(nb, src / path.name)
        pages.append(path.stem)
    write_text_atomic(src / "conf.py", conf_py(title, repo_url))
    (src / "_static").mkdir()
    write_text_atomic(src / "_static" / "favicon.svg", FAVICON)
    write_text_atomic(src / "index.md", index_page(
        title, readme_opening(root / "README.md"), pages, records, data))
    write_text_atomic(src / f"{RUN_PAGE}.md", RUN_TEXT)


def executed_notebooks(folder: Path) -> list[Path]:
    """The course's executed notebooks in ``folder`` (``NN_*.ipynb``), in order."""
    return sorted(p for p in folder.glob("*.ipynb") if _NOTEBOOK.match(p.name))


def build_book(executed_dir: Path, out: Path, *, results_json: Path | None = None,
               repo_url: str | None = None, root: Path | None = None,
               title: str = "chexnet-at-scale") -> Path:
    """Build the site from the executed notebooks in ``executed_dir`` into ``<out>/book``
    and check it; return the site's folder. The site is built beside it (``book.new``) and
    replaces it only when it passes: a failed build leaves the last good site in place.

    Raises ``FileNotFoundError`` when ``executed_dir`` holds no executed notebook, and
    ``RuntimeError`` when Sphinx fails or warns (a link to a page that is not in the book, a
    missing image) or the built site has problems (broken internal link, missing figure, a
    request to another host: :func:`site_problems`), naming them and the log.
    """
    executed = executed_notebooks(executed_dir)
    if not executed:
        raise FileNotFoundError(
            f"no executed notebook (NN_*.ipynb) in {executed_dir}: run `make tutorial` (or "
            "`make test`) first; `make book` builds from their outputs and runs nothing")
    t0 = time.perf_counter()
    root = root or repo_root()
    data = results.load(results_json) if results_json else {}
    src, site, log = out / SOURCE_DIR, out / SITE_DIR, out / LOG_NAME
    new = out / f"{SITE_DIR}.new"  # the old site stays until the new one passes its check
    write_project(executed, src, title=title, data=data, repo_url=repo_url, root=root)
    if new.exists():
        shutil.rmtree(new)
    with open(log, "w", encoding="utf-8") as f:
        done = subprocess.run(
            [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-E", "-W", "--keep-going",
             "-d", str(out / "book-doctrees"), str(src), str(new)],
            stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:  # -W: a warning (a link to no page, say) fails the build
        said = [line for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        raise RuntimeError(f"sphinx-build failed (exit {done.returncode}; {log}):\n  "
                           + "\n  ".join(said[:20]))
    problems = site_problems(new)
    if problems:
        raise RuntimeError(f"the built site {new} has {len(problems)} problem(s) ({site} is "
                           "left as it was):\n  " + "\n  ".join(problems[:40]))
    if site.exists():
        shutil.rmtree(site)
    new.rename(site)
    print(f"book: {len(executed)} notebooks -> {site / 'index.html'} in "
          f"{time.perf_counter() - t0:.0f} s (Sphinx's messages: {log})")
    return site
