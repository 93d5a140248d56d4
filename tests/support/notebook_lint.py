"""The notebook linters the suite runs on the committed notebooks (repository tooling, not
part of the package): :func:`hygiene_problems` (outputs only where nbval checks them) and
:func:`prose_number_problems` (a figure in a markdown cell is computed by this run or
labelled with its source).
"""

from __future__ import annotations

import re
from pathlib import Path

from chexnet_utils.notebook.clean import VOLATILE_NB_META, is_checked


def hygiene_problems(path: Path) -> list[str]:
    """What is wrong with a committed notebook.

    Saved widget state; outputs or execution counts in cells nbval does not check; checked
    cells without output
    or execution count; checked cells whose execution counts are not increasing (a sign they
    were run out of order, so a top-to-bottom run may not reproduce them).
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    problems = [f"{path.name}: notebook metadata {key!r} committed (saved widget state)"
                for key in VOLATILE_NB_META if key in nb.metadata]
    last_count = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if not is_checked(cell):
            if cell.outputs:
                problems.append(f"{path.name} cell {i}: output committed in a cell nbval "
                                "does not check")
            if cell.execution_count is not None:
                problems.append(f"{path.name} cell {i}: execution count "
                                f"{cell.execution_count} committed")
            continue
        if not cell.outputs or cell.execution_count is None:
            problems.append(f"{path.name} cell {i}: checked cell was not run before committing")
            continue
        if cell.execution_count <= last_count:
            problems.append(f"{path.name} cell {i}: execution count {cell.execution_count} "
                            f"after {last_count}: run top to bottom before committing")
        last_count = cell.execution_count
    return problems




# --- Only live numbers in prose -------------------------------------------------------------
#
# A figure in a notebook's markdown is either rendered by a cell from this run's variables, or
# a reference labelled with its source (and machine): a learner compares the prose with their
# own output, so an unlabelled figure from the authors' machine reads as a promise.
#
# What looks measured: a number with a unit of time, rate, size or share (``89.8 img/s``,
# ``8.5 ms``, ``900 MB``, ``20 %``), a speed-up (``2.4x``) or a bare decimal in running text
# (``0.71``). What does not: unit-less integers (14 pathologies, 112,120 images, batch 16,
# 8 GPUs, step 3, 2017); versions (TensorFlow 1.13.1, Python 3.6, arXiv ids) and section
# numbers; 0.5 and 1.0 (chance, perfect, a sigmoid's middle); counts in millions (7.0 M
# parameters); sizes of what the data or the model *is* (28 MB of gradients, 4 KiB tensors,
# 100 MB shard files); settings (``set to 10 ms``, ``STEP_COMPUTE_S = 0.1 s``); literals in
# code (only the comments of a fenced block are prose). A figure is *labelled* when its
# sentence (list item, table row, enclosing parenthesis) names a source: a paper, the
# articles, Dell, AWS, NIH, docs/benchmarks.md, the authors' run, a default or an assumption.

PROSE_NUMBER_OK = "prose-number-ok"
"""``<!-- prose-number-ok: reason -->`` in a paragraph accepts that paragraph's figures (the
odd false positive, such as arithmetic on an exercise's given numbers; the reason is
required)."""

_N = r"(?<![\w.])\d(?:[\d,]*\d)?(?:\.\d+)?"
_SIZE_UNIT = r"(?:[kKMGT]i?B|[kMGT]bytes?)"
_UNIT = (r"(?:img/s|images?/s|images per second|samples/s|steps?/s|it/s"
         r"|[kKMGT]i?B/s|[GMk]bit/s|[GMk]b/s|[GMk]bit|" + _SIZE_UNIT +
         r"|ms|us|µs|μs|ns|s|secs?|seconds?|min|minutes?|h|hours?"
         r"|%|percent|TFLOPS|GFLOPS)(?![\w/])")
_MEASURED = re.compile(
    rf"(?P<unit>{_N}\s?{_UNIT})"                       # 89.8 img/s, 8.5 ms, 20 %
    rf"|(?P<speedup>{_N}[x×](?!\w))"                     # 2.4x (not "8 x 8", "4 x p4d")
    r"|(?P<ratio>(?<![\w.])\d+\.\d+(?!\.?\d|\w|\s?(?:M|k|million|billion)\b))")  # 0.71
_LABEL = re.compile(
    r"reference|\bpaper\b|\barticles?\b|Rajpurkar|Goyal|\bDell\b|\bAWS\b|NVIDIA|\bNIH\b"
    r"|docs/benchmarks\.md|source:|measured by the authors|authors' (?:run|machine)"
    r"|et al\.|documentation|\bdocs\b|\bdefaults?\b|specification|\bassum(?:e|ed|ption)\b",
    re.IGNORECASE)
_DEFINED_SIZE = re.compile(r"gradient|parameter|tensor|float|message|PNG|TFRecord|shard"
                            r"|\bfiles?\b", re.IGNORECASE)
_VERSIONED = re.compile(
    r"(?:python|tensorflow|keras|horovod|mpi|nccl|cudnn|cuda|ubuntu|version|release|v"
    r"|arxiv:|sections?|§)(?:\s+[\d.]+\s+vs\.?)?[\s<>=~]*$", re.IGNORECASE)
_SETTING = re.compile(r"(?:\bset to|`[A-Za-z_][\w.]*`\s*(?:to|=)|=)\s*~?$")
_ROUND = {"0.0", "0.5", "1.0"}
_BOUNDARY = re.compile(
    r"\n\s*\n"                                  # paragraph
    r"|\n(?=\s*(?:[-*+]|\d+\.)\s)"              # list item
    r"|(?<![^\n])[ \t]*[|#][^\n]*"              # a table row or a heading is its own segment
    r"|(?<!e\.g)(?<!i\.e)(?<!\bal)(?<!\bvs)(?<!\bcf)[.!?](?=\s)")  # sentence end


def _spans(text: str, pattern: str, flags: int = 0) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(pattern, text, flags)]


def _inside(pos: int, spans: list[tuple[int, int]]) -> tuple[int, int] | None:
    return next((s for s in spans if s[0] <= pos < s[1]), None)


def _segment(text: str, start: int, end: int) -> str:
    """The sentence (list item, table row) around ``text[start:end]``, plus the parenthesis
    that encloses it, if any (a parenthesis may span sentences)."""
    lo, hi = 0, len(text)
    for m in _BOUNDARY.finditer(text):
        if m.end() <= start:
            lo = m.end()
        elif m.start() >= end:
            hi = m.start()
            break
        elif m.group(0).lstrip().startswith(("|", "#")):  # the match is in this row/heading
            return m.group(0)
    seg = text[lo:hi]
    depth = 0
    for i in range(start - 1, max(-1, start - 600), -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth < 0:
            close = text.find(")", end)
            return seg + " " + text[i:close + 1 if close >= 0 else len(text)]
    return seg


def unlabelled_numbers(markdown: str) -> list[str]:
    """Figures in ``markdown`` that look measured and name no source: one snippet each."""
    fences = _spans(markdown, r"^[ \t]*```[^\n]*\n.*?^[ \t]*```", re.M | re.S)
    comments = [(f[0] + m.start(), f[0] + m.end()) for f in fences
                for m in re.finditer(r"(?<=\s)#[^\n]*", markdown[f[0]:f[1]])]
    code_spans = _spans(markdown, r"`[^`\n]+`")
    lines = _spans(markdown, r"[^\n]+")
    ok_paragraphs = [p for p in _spans(markdown, r"(?:[^\n]|\n(?![ \t]*\n))+")
                     if re.search(PROSE_NUMBER_OK + r":\s*\w", markdown[p[0]:p[1]])]
    found = []
    for m in _MEASURED.finditer(markdown):
        s, e = m.span()
        before = markdown[max(0, s - 40):s]
        fence, span = _inside(s, fences), _inside(s, code_spans)
        if _inside(s, ok_paragraphs) or _SETTING.search(before):
            continue
        if not fence and markdown[_inside(s, lines)[0]:].lstrip().startswith("#"):
            continue  # a heading: "### 5.1 ..."
        if span and "=" in markdown[span[0]:span[1]]:
            continue  # `STEP_COMPUTE_S = 0.1 s`: a setting written as code
        if m.lastgroup == "ratio":
            if (fence and not _inside(s, comments)) or span or m.group(0) in _ROUND:
                continue
            if _VERSIONED.search(before):
                continue
        if fence:
            line = _inside(s, lines)
            segment = markdown[line[0]:line[1]]
        else:
            segment = _segment(markdown, s, e)
        if _LABEL.search(segment):
            continue
        if m.lastgroup == "unit" and re.search(_SIZE_UNIT + r"$", m.group(0)) \
                and _DEFINED_SIZE.search(segment):
            continue
        found.append(" ".join(markdown[max(0, s - 40):e + 20].split()))
    return found


def prose_number_problems(path: Path) -> list[str]:
    """Unlabelled, measured-looking figures in the markdown cells of a notebook, as
    ``"<notebook> cell <index>: ...<snippet>..."``."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return [f"{path.name} cell {i}: ...{snippet}..."
            for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
            for snippet in unlabelled_numbers(cell.source)]
