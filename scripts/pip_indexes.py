"""Print uv's index options for the indexes pip is configured with, one argument per line.

``make setup`` installs the hash-locked stack with uv (requirements/uv.txt), which does not
read pip's configuration; this reads it (``pip config list``: the ``PIP_*`` environment,
then the configuration files' ``install`` and ``global`` sections, pip's order of precedence)
and prints ``--no-index``, ``--index-url``, ``--extra-index-url`` and ``--find-links`` for uv, so
uv looks where pip would. Run with the environment's Python: ``python scripts/pip_indexes.py``.
"""

from __future__ import annotations

import subprocess
import sys

KEYS = ("index-url", "extra-index-url", "find-links")
TRUE = ("1", "true", "yes", "on")
SCOPES = (":env:.", "install.", "global.")  # first found wins, as in pip


def uv_index_args(config_lines: list[str]) -> list[str]:
    """uv's options for the ``no-index``, ``index-url``, ``extra-index-url`` and
    ``find-links`` settings in ``pip config list`` output (``scope.key='value'`` lines; a value
    may list several space-separated URLs or folders)."""
    found: dict[str, str] = {}
    for scope in SCOPES:
        for line in config_lines:
            key, _, value = line.partition("=")
            name = key[len(scope):] if key.startswith(scope) else None
            if name in (*KEYS, "no-index"):
                found.setdefault(name, value.strip().strip("'\""))
    args: list[str] = ["--no-index"] if found.get("no-index", "").lower() in TRUE else []
    for name in KEYS:
        for value in found.get(name, "").split():
            args += [f"--{name}", value]
    return args


def main() -> int:
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, check=False).stdout
    print("\n".join(uv_index_args(out.splitlines())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
