"""The notebooks' house rules of docs/architecture.md, checked on the tree (the package's own
rules are ruff's, import-linter's and mypy's, in `make lint`): notebooks that teach by showing
(the lesson code, functions and classes included, in readable cells of at most about 40
lines, holding the APIs each notebook teaches) and hold no plumbing (processes, path
juggling, hand-built tables and figures, more than one results cell); one place for settings
(the scale preset: no ``SCALE.name == ...`` branches, no ``CHEXNET_*`` read from the
environment)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_CELL_LINES = 40

# What each notebook teaches, as code its cells must contain (substrings of the code cells,
# markdown not counted). A notebook's entry grows with its lessons.
LESSON_APIS: dict[str, tuple[str, ...]] = {
    "00_environment_check": ("hvd.init()", "hvd.local_rank()", "tf.config.set_visible_devices",
                             "tf.sysconfig.get_build_info()", "hvd.nccl_built()"),
    "01_data_preparation": ("tf.train.Example", "tf.io.TFRecordWriter", "tf.data.TFRecordDataset",
                            "tf.io.parse_single_example", "tf.train.Features",
                            "tf.train.BytesList", "tf.train.FloatList", "tf.train.Int64List",
                            "SerializeToString(deterministic=True)", "tf.io.FixedLenFeature",
                            "writer.write(", "def shard_plan", "tf.io.decode_png"),
    "02_input_pipeline_old_vs_new": ("from_tensor_slices", ".shard(", ".interleave(",
                                     ".prefetch(", "num_parallel_calls", "tf.data.Options()",
                                     "map_parallelization", "tf.io.decode_png", ".batch(",
                                     "inject_prefetch", ".with_options(",
                                     "tf.data.TFRecordDataset", ".shuffle(", ".repeat(",
                                     ".flat_map(", "tf.data.AUTOTUNE", "deterministic=",
                                     "tf.io.parse_single_example", "tf.io.parse_example",
                                     "tf.image.resize", "tf.image.random_flip_left_right",
                                     "tf.map_fn", "def parse_and_preprocess", "def old_pipeline",
                                     "def new_pipeline", "vectorized=True"),
    "03_training_single_worker": ("def train_step", "tf.GradientTape", ".compile(", ".fit(",
                                  "ReduceLROnPlateau", "ModelCheckpoint", "keras.losses.Loss",
                                  "keras.metrics.AUC", "keras.callbacks.Callback",
                                  "tape.gradient(", "[v.value for v in", "apply_gradients",
                                  "CSVLogger", "profile_batch", "enable_op_determinism",
                                  "training.train(", "weights_sha256", "explain.grad_cam"),
    "04_distributed_training_horovod": ("%%px", "hvd.init()", "hvd.local_rank()", "hvd.size()",
                                        "hvd.DistributedGradientTape", "hvd.broadcast_variables",
                                        "hvd.keras.DistributedOptimizer", "apply_async",
                                        "apply_sync"),
    "05_communication_and_scaling": ("%%px", "def ring_allreduce", "def reduce_scatter",
                                     "def allgather", "def parameter_server", "hvd.alltoall(",
                                     "hvd.broadcast(", "hvd.allreduce(", "hvd.reducescatter(",
                                     "hvd.allgather(", "comm.fit_alpha_beta"),
    "06_inside_horovod": ("%%px", "hvd.DistributedGradientTape", "MultiWorkerMirroredStrategy",
                          "strategy.scope()", "strategy.run(", "hvd.Compression.fp16",
                          "HOROVOD_TIMELINE", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME",
                          "bind_to=", "binding_plan("),
    "07_feeding_at_scale": (".cache(", ".snapshot(", "list_files(", ".shard(",
                            "keras.utils.PyDataset", "DispatchServer", "WorkerServer",
                            "service.distribute(", "require_private_network"),
    "08_appendix_slurm": ("LocalSlurm(", "SlurmCluster(", '"sinfo"', '"squeue"',
                          "slurm_horovod.sbatch", "wait_for_job"),
    "09_appendix_two_nodes": ("bench_link(", "rate_bit=", "link.tables()", ".loopback_comparison(",
                              "leftovers("),
    "10_appendix_elastic": ("%%writefile", "@hvd.elastic.run", "hvd.elastic.ObjectState",
                            "state.commit()", "register_reset_callbacks", ".shard(",
                            "hvd.DistributedGradientTape", "hvd.broadcast_variables",
                            "def restore", "def sync", "HorovodJob(", "kill_worker(",
                            "set_hosts("),
}

WIDTH_SPEC = re.compile(r"^(?:.?[<>=^])?[+\- ]?z?#?0?[1-9]")   # a format spec with a width


def _code_cells(nb: Path) -> list[tuple[int, str]]:
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def _tree(src: str) -> ast.Module:
    """A code cell as Python: IPython magics and shell lines (``%``, ``!``) left out."""
    return ast.parse("\n".join(ln for ln in src.splitlines()
                               if not ln.lstrip().startswith(("%", "!"))))


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os") \
        or (isinstance(node, ast.Name) and node.id == "environ")


def _chexnet_or_unknown(key: ast.AST | None) -> bool:
    """A key that is, or may be, a ``CHEXNET_*`` variable (anything but another literal)."""
    return not (isinstance(key, ast.Constant) and isinstance(key.value, str)) \
        or key.value.startswith("CHEXNET_")


def environ_reads(src: str) -> list[str]:
    """Reads of ``CHEXNET_*`` (or of unknown names, or of the whole environment) from
    ``os.environ`` / ``os.getenv`` in a cell; writes (``os.environ.update``, ``[k] = v``) and
    other literal names (``setdefault("TF_CPP_MIN_LOG_LEVEL", ...)``) are fine."""
    found = []
    for n in ast.walk(_tree(src)):
        if isinstance(n, ast.Subscript) and _is_environ(n.value) and isinstance(n.ctx, ast.Load) \
                and _chexnet_or_unknown(n.slice):
            found.append(ast.unparse(n))
        elif isinstance(n, ast.Call):
            f, first = n.func, (n.args[0] if n.args else None)
            env_method = isinstance(f, ast.Attribute) and _is_environ(f.value)
            getenv = (isinstance(f, ast.Attribute) and f.attr == "getenv") or \
                (isinstance(f, ast.Name) and f.id == "getenv")
            if (env_method and f.attr in ("get", "pop", "setdefault") or getenv) \
                    and _chexnet_or_unknown(first):
                found.append(ast.unparse(n))
            elif env_method and f.attr in ("copy", "items", "keys", "values"):
                found.append(ast.unparse(n))
            elif any(_is_environ(a) for a in n.args):        # dict(os.environ), f(os.environ)
                found.append(ast.unparse(n))
        elif (isinstance(n, ast.Compare)
              and any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops)
              and any(_is_environ(c) for c in n.comparators) and _chexnet_or_unknown(n.left)):
            found.append(ast.unparse(n))
    return found


def _is_scale(node: ast.AST) -> bool:
    """``SCALE`` (any case) or a call of ``scale()`` / ``config.scale()``."""
    if isinstance(node, ast.Name):
        return node.id.lower() == "scale"
    if isinstance(node, ast.Call):
        f = node.func
        return (isinstance(f, ast.Name) and f.id == "scale") or \
            (isinstance(f, ast.Attribute) and f.attr == "scale")
    return False


def _is_scale_name(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "name" and _is_scale(node.value)


def scale_name_branches(src: str) -> list[str]:
    """Settings chosen by the preset's name: ``SCALE.name == "ci"``, ``... in (...)``,
    ``match SCALE.name``, ``{...}[SCALE.name]``, ``d.get(SCALE.name)``."""
    found = []
    for n in ast.walk(_tree(src)):
        if isinstance(n, ast.Compare) and any(map(_is_scale_name, [n.left, *n.comparators])):
            found.append(ast.unparse(n))
        elif isinstance(n, ast.Match) and _is_scale_name(n.subject):
            found.append(f"match {ast.unparse(n.subject)}")
        elif isinstance(n, ast.Subscript) and _is_scale_name(n.slice):
            found.append(ast.unparse(n))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr == "get" and n.args and _is_scale_name(n.args[0]):
            found.append(ast.unparse(n))
    return found


def _width_fields(node: ast.AST) -> list[ast.FormattedValue]:
    """The f-string fields under ``node`` formatted with a width (``{x:>10}``, ``{y:7.1f}``)."""
    def spec(fv: ast.FormattedValue) -> str:
        parts = fv.format_spec.values if fv.format_spec else []
        return "".join(p.value for p in parts if isinstance(p, ast.Constant))
    return [fv for fv in ast.walk(node)
            if isinstance(fv, ast.FormattedValue) and WIDTH_SPEC.match(spec(fv))]


def hand_built_tables(src: str) -> list[str]:
    """``print`` calls that lay out a table by hand: a literal padded to a width (a header
    row, ``{'ms':>8}``, or a blank column, ``{'':<21}``), or, in a loop, a row of three or
    more fields with widths. Use :func:`chexnet_utils.notebook.tables.table` instead."""
    tree = _tree(src)
    in_loop = {id(n) for loop in ast.walk(tree) if isinstance(loop, (ast.For, ast.While))
               for stmt in loop.body for n in ast.walk(stmt)}
    found = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"):
            continue
        fields = [fv for a in n.args for fv in _width_fields(a)]
        padded_literal = any(isinstance(fv.value, ast.Constant) for fv in fields)
        if padded_literal or (id(n) in in_loop and len(fields) >= 3):
            found.append(ast.unparse(n)[:80])
    return found


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_lesson_cells_stay_readable(nb: Path):
    """Lesson code lives in the notebook (functions and classes included: a ``train_step``,
    a map function, a ``PyDataset``); a cell stays short enough to read on one screen."""
    long_cells = {i: len(src.splitlines()) for i, src in _code_cells(nb)
                  if len(src.splitlines()) > MAX_CELL_LINES}
    assert long_cells == {}, f"code cells over {MAX_CELL_LINES} lines (cell: lines)"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_code_cells_hold_the_apis_they_teach(nb: Path):
    """The APIs a notebook teaches are in its *code* cells (written, run, editable), not only
    named in its prose or hidden behind a helper."""
    assert nb.stem in LESSON_APIS, f"add {nb.stem} to LESSON_APIS: the APIs its code cells teach"
    code = "\n".join(src for _, src in _code_cells(nb))
    missing = [api for api in LESSON_APIS[nb.stem] if api not in code]
    assert missing == [], f"lesson APIs not in any code cell of {nb.stem}"


def test_every_lesson_api_list_names_a_notebook():
    assert sorted(LESSON_APIS) == sorted(nb.stem for nb in NOTEBOOKS)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_hold_no_plumbing(nb: Path):
    """Process management, path juggling and hand-made figures belong in the package; the
    headline numbers are recorded in one cell."""
    found = [(i, p) for i, src in _code_cells(nb) for p in plumbing(src)]
    assert found == [], "plumbing in a notebook: move it into chexnet_utils"
    recording = [i for i, src in _code_cells(nb) if "results.record(" in src]
    assert len(recording) <= 1, f"results recorded in cells {recording}: fold them into one"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_settings_come_from_config_and_results_are_numbered(nb: Path):
    reads = [i for i, src in _code_cells(nb)
             if re.search(r"(os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*[\"']CHEXNET_", src)]
    assert reads == [], "read CHEXNET_* settings through config.scale()"
    reads = [(i, r) for i, src in _code_cells(nb) for r in environ_reads(src)]
    assert reads == [], "read CHEXNET_* settings through config.scale(), not os.environ"
    branches = [(i, b) for i, src in _code_cells(nb) for b in scale_name_branches(src)]
    assert branches == [], ("a setting that differs between presets is a field of "
                            "config.Scale (with a value per preset), not a test of SCALE.name")
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    headings = [ln for c in cells if c["cell_type"] == "markdown"
                for ln in "".join(c["source"]).splitlines() if ln.startswith("## ")]
    assert any(re.fullmatch(r"## \d+\. Results", h.strip()) for h in headings), headings


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_tables_use_the_one_helper(nb: Path):
    by_hand = [(i, t) for i, src in _code_cells(nb) for t in hand_built_tables(src)]
    assert by_hand == [], ("show tables with chexnet_utils.notebook.tables.table(rows) (or, "
                           "where nbval checks the text, print(markdown_table(rows))), "
                           "not print + widths")


PLUMBING_CALLS = {
    "subprocess": "a subprocess", "os.kill": "signals", "psutil": "process handling",
    "os.chdir": "path juggling", "sys.path": "path juggling", "plt.subplots": "a figure by hand",
    "fig.add_subplot": "a figure by hand", "plt.figure": "a figure by hand",
}


def plumbing(src: str) -> list[str]:
    """What a learner need not read in a cell: processes started or signalled by hand
    (``subprocess``, ``os.kill``, ``psutil``), ``sys.path`` / ``os.chdir``, figures laid
    out by hand (``plt.subplots``; use ``chexnet_utils.plots``)."""
    names = {ast.unparse(n) for n in ast.walk(_tree(src))
             if isinstance(n, (ast.Attribute, ast.Name))}
    imported = {a.name.split(".")[0] for n in ast.walk(_tree(src))
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in getattr(n, "names", [])}
    imported |= {n.module.split(".")[0] for n in ast.walk(_tree(src))
                 if isinstance(n, ast.ImportFrom) and n.module}
    return sorted({f"{key}: {what}" for key, what in PLUMBING_CALLS.items()
                   if key in names or key in imported})


def test_the_notebook_detectors_catch_what_they_should():
    assert scale_name_branches('CI = SCALE.name == "ci"\nx = 5 if CI else 10')
    assert scale_name_branches('n = {"ci": 3}.get(SCALE.name, 16)')
    assert scale_name_branches('if config.scale().name in ("ci",):\n    pass')
    assert scale_name_branches('n = {"ci": 3}[SCALE.name]')
    assert not scale_name_branches('print(f"scale {SCALE.name}")\nrow = {"scale": SCALE.name}')
    for read in ('os.environ["CHEXNET_SCALE"]', 'os.environ.get("CHEXNET_X", "1")',
                 'os.getenv("CHEXNET_X")', '"CHEXNET_X" in os.environ', "os.environ.get(var)",
                 "env = dict(os.environ)", "os.environ.copy()"):
        assert environ_reads(read), read
    for fine in ('os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")',
                 "os.environ.update(PLAN.engine_env)", 'os.environ["HOROVOD_X"] = "1"'):
        assert environ_reads(fine) == [], fine
    header = "print(f\"{'workers':>8} {'ring':>22}\")"
    loop_row = 'for n in ns:\n    print(f"{n:>8} {a:>19.1f} MB {b:>21.1f} MB")'
    assert hand_built_tables(header) and hand_built_tables(loop_row)
    assert hand_built_tables("%time x = 1\nprint(f\"{'':<21} sum\")")
    assert not hand_built_tables('for tl in sim:\n    print(f"{tl.label}: {tl.step_s:.1f} s")')
    assert not hand_built_tables('print(f"one core decodes {rate:7.1f} images/s")')
    assert plumbing("import subprocess\nsubprocess.run(['ls'])")
    assert (plumbing("fig, ax = plt.subplots()")
            and plumbing("import sys\nsys.path.insert(0, '..')"))
    assert plumbing("os.kill(pid, 9)")
    assert plumbing("@tf.function\ndef step(x):\n    return x") == []
    assert plumbing("fig = plots.timeline(r)\nplt.show()") == []


# ---- the package: module size and imports hidden inside functions (issue #50) ---------------

PACKAGE = Path(__file__).resolve().parents[2] / "chexnet_utils"
MAX_MODULE_LINES = 700
MAX_LOCAL_IMPORTS = 160
MAX_LOCAL_HEAVY_IMPORTS = 35
HEAVY_LIBRARIES = ("tensorflow", "keras", "horovod")


def function_local_imports(source: str) -> list[ast.Import | ast.ImportFrom]:
    """The import statements inside a function (nested functions and methods included)."""
    found: dict[int, ast.Import | ast.ImportFrom] = {}
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found[id(node)] = node
    return list(found.values())


def imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module or ""]


def test_package_modules_stay_small_and_name_their_imports_at_the_top():
    """No module over 700 lines; at most 160 function-local imports, at most 35 of them
    TensorFlow, Keras or Horovod (the others name them at their top with
    ``platform.lazy.lazy_module``: docs/architecture.md, "The TensorFlow boundary")."""
    local = heavy = 0
    too_long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if source.count("\n") > MAX_MODULE_LINES:
            too_long[str(path.relative_to(PACKAGE))] = source.count("\n")
        for node in function_local_imports(source):
            local += 1
            heavy += any(name.split(".")[0] in HEAVY_LIBRARIES for name in imported_names(node))
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines: {too_long}"
    assert local <= MAX_LOCAL_IMPORTS, f"{local} function-local imports (<= {MAX_LOCAL_IMPORTS})"
    assert heavy <= MAX_LOCAL_HEAVY_IMPORTS, \
        f"{heavy} function-local TensorFlow/Keras/Horovod imports (<= {MAX_LOCAL_HEAVY_IMPORTS})"
    print(f"package: {local} function-local imports, {heavy} of TensorFlow/Keras/Horovod")


def test_a_lazy_module_imports_on_first_use_only():
    import subprocess
    import sys

    code = ("import sys\n"
            "from chexnet_utils.platform.lazy import lazy_module\n"
            "colorsys = lazy_module('colorsys')\n"
            "assert 'colorsys' not in sys.modules, 'imported too early'\n"
            "print(repr(colorsys))\n"
            "assert colorsys.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)\n"
            "assert 'colorsys' in sys.modules\n"
            "print(repr(colorsys))\n"
            "import pickle\n"
            "again = pickle.loads(pickle.dumps(colorsys))\n"
            "assert again.hsv_to_rgb(0.0, 1.0, 1.0) == (1.0, 0.0, 0.0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["<lazy module 'colorsys' (not imported yet)>",
                                          "<lazy module 'colorsys' (imported)>"]
