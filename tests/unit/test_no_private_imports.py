"""No module of chexnet_utils imports another module's private name.

A name that another module needs is public (no leading underscore); a cross-module
``from chexnet_utils.x import _y`` means either the name should be public or the code
should live where it is used. Parsed with ``ast`` (nothing is imported or run), including
imports inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import chexnet_utils

PACKAGE = Path(chexnet_utils.__file__).parent


def private_imports(source: str) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` of every ``from chexnet_utils... import _name`` in
    ``source`` (dunder names such as ``__version__`` are allowed)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = "." * node.level + (node.module or "")  # a relative import stays inside
        if not (node.level or module == "chexnet_utils"
                or module.startswith("chexnet_utils.")):
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append((node.lineno, module, alias.name))
    return sorted(found)


def test_the_checker_finds_private_imports() -> None:
    src = ("from chexnet_utils.data.tfrecords.plan import _Item, shard_name\n"
           "def f():\n    from chexnet_utils import _hidden\n"
           "from os import _exit\nfrom chexnet_utils import __version__\n"
           "from .anatomy import _u\n")
    assert private_imports(src) == [(1, "chexnet_utils.data.tfrecords.plan", "_Item"),
                                    (3, "chexnet_utils", "_hidden"), (6, ".anatomy", "_u")]


def test_no_module_imports_a_private_name() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}: from {module} import {name}"
                 for path in modules
                 for line, module, name in private_imports(path.read_text(encoding="utf-8"))]
    assert offenders == [], "make these names public or move the code:\n" + "\n".join(offenders)
