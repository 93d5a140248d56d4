"""Move modules of ``chexnet_utils`` into a wing (a subpackage) and rewrite every reference.

Issue 28 regroups the package's flat top level into wings by concern, one wing per change,
with no compatibility shims: every import, dotted name and path in the repository is rewritten
to the new place. This tool does one such move::

    python tools/move_modules.py data labels nih leakage data=prepare synthetic tfrecords

moves ``chexnet_utils/labels.py`` to ``chexnet_utils/data/labels.py`` (a package folder such
as ``synthetic/`` moves whole; ``data=prepare``: ``data.py`` becomes ``data/prepare.py``,
for a module named like its wing), writes the wing's ``__init__.py`` if there is none (its
docstring is to be written by hand: the wing's map), and rewrites in every file git tracks
(code, notebooks, docs, Makefile, scripts):

- dotted names: ``chexnet_utils.nih`` -> ``chexnet_utils.data.nih`` (also in strings:
  ``monkeypatch`` targets, ``python -m``, Sphinx roles);
- paths: ``chexnet_utils/nih.py`` -> ``chexnet_utils/data/nih.py``;
- ``from chexnet_utils import a, nih, b`` -> ``from chexnet_utils import a, b`` and
  ``from chexnet_utils.data import nih`` (parenthesised lists too, in notebooks' cells as well).

It uses ``git mv`` so history follows the files, and prints what it changed. It changes no
code otherwise: run the suite afterwards. Removed when the last wing has moved.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "chexnet_utils"
TEXT_SUFFIXES = {".py", ".ipynb", ".md", ".sh", ".sbatch", ".toml", ".cfg", ".txt", ".yml", ""}
SKIP_PREFIXES = ("patches/", "requirements/")  # requirements: the lock digests them


def plan(wing: str, specs: list[str]) -> dict[str, str]:
    """Old dotted module -> new dotted module for ``specs`` (``name`` or ``name=new_name``)."""
    moves = {}
    for spec in specs:
        old, _, new = spec.partition("=")
        moves[f"{PACKAGE}.{old}"] = f"{PACKAGE}.{wing}.{new or old}"
    return moves


def move_files(wing: str, moves: dict[str, str]) -> None:
    """``git mv`` each module (``x.py``) or package (``x/``) into the wing's folder."""
    folder = ROOT / PACKAGE / wing
    staged: list[tuple[Path, Path]] = []
    for old, new in moves.items():
        src = ROOT / Path(*old.split("."))
        dst = ROOT / Path(*new.split("."))
        if src.with_suffix(".py").is_file():
            staged.append((src.with_suffix(".py"), dst.with_suffix(".py")))
        elif src.is_dir():
            staged.append((src, dst))
        else:
            sys.exit(f"no module or package {old}")
    # a module named like its wing (data.py -> data/) moves aside first
    for i, (src, dst) in enumerate(staged):
        if src.with_suffix("") == folder:
            aside = src.with_name(f"_{src.name}")
            subprocess.run(["git", "mv", str(src), str(aside)], cwd=ROOT, check=True)
            staged[i] = (aside, dst)
    folder.mkdir(exist_ok=True)
    init = folder / "__init__.py"
    if not init.exists():
        init.write_text(f'"""The {wing} wing (map to be written)."""\n', encoding="utf-8")
        subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
    for src, dst in staged:
        subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)


def dotted_pattern(moves: dict[str, str]) -> re.Pattern[str]:
    names = sorted(moves, key=len, reverse=True)
    return re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in names) + r")(?![\w])")


def path_pattern(moves: dict[str, str]) -> tuple[re.Pattern[str], dict[str, str]]:
    paths = {}
    for old, new in moves.items():
        o, n = old.replace(".", "/"), new.replace(".", "/")
        paths[o + ".py"] = n + ".py"
        paths[o + "/"] = n + "/"
    names = sorted(paths, key=len, reverse=True)
    return re.compile(r"(?<![\w/])(" + "|".join(re.escape(n) for n in names) + ")"), paths


FROM_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from " + PACKAGE + r" import (?:\((?P<group>[^)]*)\)|(?P<line>[^\n(]+))",
    re.M)


def split_names(text: str) -> list[tuple[str, str]]:
    """``a, b as c  # note`` -> [("a", "a"), ("b", "b as c")] (comments dropped)."""
    text = re.sub(r"#[^\n]*", "", text)
    out = []
    for part in text.replace("\n", " ").split(","):
        part = " ".join(part.split())
        if part:
            out.append((part.split(" as ")[0], part))
    return out


def format_import(indent: str, module: str, items: list[str], width: int = 99) -> str:
    one = f"{indent}from {module} import {', '.join(items)}"
    if len(one) <= width:
        return one
    lines, line = [], f"{indent}from {module} import ("
    pad = " " * len(line)
    for i, item in enumerate(items):
        piece = item + (", " if i < len(items) - 1 else ")")
        if len(line) + len(piece.rstrip()) > width and not line.endswith("("):
            lines.append(line.rstrip())
            line = pad
        line += piece
    lines.append(line)
    return "\n".join(lines)


def rewrite_from_imports(text: str, moves: dict[str, str]) -> str:
    """Split ``from chexnet_utils import ...`` lines whose names moved into a wing."""
    moved = {old.rsplit(".", 1)[1]: new for old, new in moves.items()}

    def repl(m: re.Match[str]) -> str:
        names = split_names(m.group("group") if m.group("group") is not None else m.group("line"))
        if not any(name in moved for name, _ in names):
            return m.group(0)
        stay = [item for name, item in names if name not in moved]
        by_parent: dict[str, list[str]] = {}
        for name, item in names:
            if name in moved:
                parent, new_name = moved[name].rsplit(".", 1)
                alias = item.split(" as ")[1] if " as " in item else None
                if new_name != name and alias is None:
                    alias = name
                entry = new_name + (f" as {alias}" if alias and alias != new_name else "")
                by_parent.setdefault(parent, []).append(entry)
        out = []
        indent = m.group("indent")
        if stay:
            out.append(format_import(indent, PACKAGE, stay))
        for parent in sorted(by_parent):
            out.append(format_import(indent, parent, sorted(by_parent[parent])))
        trailing = ("" if m.group("group") is not None
                    else re.search(r"\s*$", m.group("line")).group(0))
        return "\n".join(out) + trailing

    text = FROM_IMPORT.sub(repl, text)

    def inline(m: re.Match[str]) -> str:  # in a string or a docstring: one name
        name = m.group(1)
        if name not in moved:
            return m.group(0)
        parent, new_name = moved[name].rsplit(".", 1)
        alias = m.group(2) or (name if new_name != name else None)
        return f"from {parent} import {new_name}" + (f" as {alias}" if alias else "")

    return re.sub(r"(?<=[^\s])(?<!^)from " + PACKAGE + r" import (\w+)(?: as (\w+))?(?![\w,])",
                  inline, text, flags=re.M)


IMPORT_RUN = re.compile(
    r"(?:^(?P<i>[ \t]*)(?:from|import) " + PACKAGE + r"\b[^\n(]*(?:\([^)]*\))?[^\n]*\n)"
    r"(?:(?P=i)(?:from|import) " + PACKAGE + r"\b[^\n(]*(?:\([^)]*\))?[^\n]*\n)*", re.M)
STATEMENT = re.compile(r"[ \t]*(?:from|import) [^\n(]*(?:\([^)]*\))?[^\n]*\n")


def sort_package_imports(text: str) -> str:
    """Sort each run of consecutive ``chexnet_utils`` imports (same indentation) by module,
    as isort does: ``from chexnet_utils import`` first, then the dotted modules."""
    def key(statement: str) -> tuple[int, str]:
        module = statement.split()[1]
        return (0 if statement.lstrip().startswith("import ") else 1, module)

    def repl(m: re.Match[str]) -> str:
        statements = STATEMENT.findall(m.group(0))
        if "".join(statements) != m.group(0):
            return m.group(0)  # something this simple reader does not follow: left as is
        return "".join(sorted(statements, key=key))

    return IMPORT_RUN.sub(repl, text)


def rewrite_text(text: str, moves: dict[str, str]) -> str:
    """Dotted names and paths first (on the old names only), then the bare from-imports;
    the runs of package imports that changed are sorted again."""
    new = dotted_pattern(moves).sub(lambda m: moves[m.group(1)], text)
    pattern, paths = path_pattern(moves)
    new = pattern.sub(lambda m: paths[m.group(1)], new)
    new = rewrite_from_imports(new, moves)
    return sort_package_imports(new) if new != text else text


def rewrite_notebook(raw: str, moves: dict[str, str]) -> str:
    """Every cell's source (code and markdown), kept in nbformat's one-string-per-line form."""
    nb = json.loads(raw)
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        new = rewrite_text(source, moves)
        if new != source:
            cell["source"] = new.splitlines(keepends=True)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.split()
    return [ROOT / f for f in out if not f.startswith(SKIP_PREFIXES)
            and (Path(f).suffix in TEXT_SUFFIXES or Path(f).name == "Makefile")]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    wing, specs = argv[0], argv[1:]
    moves = plan(wing, specs)
    move_files(wing, moves)
    changed = []
    for path in tracked_files():
        if not path.is_file():
            continue
        try:
            raw = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite_notebook(raw, moves) if path.suffix == ".ipynb" else rewrite_text(raw, moves)
        if new != raw:
            path.write_text(new, encoding="utf-8")
            changed.append(path.relative_to(ROOT).as_posix())
    print(f"moved {len(moves)} into {PACKAGE}/{wing}/; rewrote {len(changed)} files:")
    for name in changed:
        print("  ", name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
