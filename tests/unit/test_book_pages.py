"""How ``make book`` readies an executed notebook for its page, and the offline site check,
on notebooks and pages made here (#49; the built site: tests/notebooks/test_book.py)."""

from __future__ import annotations

from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from chexnet_utils.notebook.book import (
    conf_py,
    prepare_notebook,
    readme_opening,
    where_it_stopped,
    widgets_as_text,
)
from chexnet_utils.notebook.site_check import site_problems

VIEW = "application/vnd.jupyter.widget-view+json"


def bar_output(model_id: str = "box") -> dict:
    return new_output("display_data", data={VIEW: {"model_id": model_id},
                                            "text/plain": "  0%|          | 0/4"})


def test_a_progress_bar_without_saved_state_is_left_out_not_shown_at_zero():
    nb = new_notebook(cells=[new_code_cell("x", outputs=[bar_output(), new_output(
        "stream", name="stdout", text="done\n")])])
    widgets_as_text(nb)   # nbval saved no widget state: the 0 % text would be a lie
    assert [o.output_type for o in nb.cells[0].outputs] == ["stream"]


def test_an_int_progress_bar_is_drawn_too():
    nb = new_notebook(cells=[new_code_cell("x", outputs=[bar_output()])])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
        "box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_p"]}},
        "p": {"model_name": "IntProgressModel", "state": {"value": 3, "max": 3}}}}}
    widgets_as_text(nb)
    assert nb.cells[0].outputs[0]["data"] == {"text/plain": "|" + "\u2588" * 10 + "|"}
    assert "widgets" not in nb.metadata


def test_where_a_run_stopped_an_error_or_cells_left_unexecuted():
    done = new_code_cell("a", execution_count=1)
    error = new_code_cell("b", execution_count=2, outputs=[new_output(
        "error", ename="ValueError", evalue="bad", traceback=[])])
    assert where_it_stopped(new_notebook(cells=[done, new_code_cell("c", execution_count=2)])) \
        is None
    assert where_it_stopped(new_notebook(cells=[done, error])) == \
        "code cell 2 raised ValueError: bad"
    assert where_it_stopped(new_notebook(cells=[done, new_code_cell("c")])) == \
        "code cells from 2 on were not executed"
    assert where_it_stopped(new_notebook(cells=[new_code_cell("c")])) is None  # never run


def test_the_boxes_go_after_the_title_cell_and_a_page_without_one_gets_a_title():
    nb = new_notebook(cells=[new_markdown_cell("Intro"), new_markdown_cell("# 03 · Title"),
                             new_code_cell("a", execution_count=1),
                             new_code_cell("b", execution_count=None)])
    prepare_notebook(nb, "03_x.ipynb", clean_name="_repo/notebooks/03_x.ipynb")
    sources = [c.source for c in nb.cells]
    assert sources[1] == "# 03 · Title"
    assert "Measured on" in sources[2] and "outputs cleared but those nbval checks" in sources[2]
    assert "This run did not finish" in sources[3] and ":class: warning" in sources[3]
    untitled = new_notebook(cells=[new_code_cell("a")])
    prepare_notebook(untitled, "04_y.ipynb", clean_name="c")
    assert untitled.cells[0].source == "# 04_y" and "Measured on" in untitled.cells[1].source


def test_conf_py_is_python_literals_and_keeps_strings_as_they_are():
    conf = conf_py("t", "https://github.com/truenorth/falsehood")
    namespace: dict = {}
    exec(compile(conf, "conf.py", "exec"), namespace)   # our own generated text
    assert namespace["html_theme_options"]["repository_url"] == \
        "https://github.com/truenorth/falsehood"
    assert namespace["nb_ipywidgets_js"] == {} and namespace["nb_execution_mode"] == "off"
    assert ["html", "text/latex", None] in namespace["nb_mime_priority_overrides"]


def test_readme_opening_keeps_images_and_drops_local_links(tmp_path: Path):
    readme = tmp_path / "README.md"
    readme.write_text("# t\n\nSee [setup](#setup), [docs](docs/x.md), [web](https://x.org) "
                      "and ![a figure](docs/f.png).\n\n## setup\n")
    assert readme_opening(readme) == ("See setup, docs, [web](https://x.org) and "
                                      "![a figure](docs/f.png).")


def test_site_check_finds_what_leaves_the_site_folder(tmp_path: Path):
    site = tmp_path / "book"
    site.mkdir()
    (tmp_path / "book.log").write_text("x")
    (tmp_path / "x.png").write_bytes(b"png")
    (site / "index.html").write_text('<html><body><h1 id="top">t</h1><a href="#top">ok</a>'
                                     '<a href="../book.log">log</a><img src="../x.png">'
                                     '<a href="#nowhere">no</a></body></html>')
    assert site_problems(site) == [
        "index.html: resource ../x.png is outside the site's folder",
        "index.html: link ../book.log leaves the site's folder",
        "index.html: link #nowhere: no #nowhere in index.html"]
