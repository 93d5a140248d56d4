#!/usr/bin/env python3
"""Hash-locked requirements for every supported Python (issue 30 item 4): ``make lock``.

For each CPython X.Y in scripts/python_choice.sh's SUPPORTED list and each flavour

    cpu      requirements/base.txt + build.txt + tf-cpu.txt   (make setup)
    gpu      requirements/base.txt + build.txt + gpu.txt      (make setup GPU=1, gpu-build-check)
    no-deps  requirements/no-deps.txt                         (installed with --no-deps)

it writes ``requirements/lock/py3XX-<flavour>.txt``: every package pip resolves for that
Python (transitive dependencies included), pinned with ``==`` and with the sha256 of every
Linux wheel for that Python the configured package indexes serve for that version (pip's own
configuration: index-url, extra-index-url, find-links, so local mirrors count too). `make
setup` installs it with ``pip install --require-hashes --only-binary :all:``: a file whose
digest is not in the lock is refused.

The resolution runs in a throw-away venv made by that Python (markers such as
``python_version < "3.11"`` are evaluated by the Python they are for), with
``pip install --dry-run --python-version X.Y --report``: Requires-Python is checked against
X.Y.0, so the lock holds on every patch release (Debian 12 ships 3.11.2); the digests come from the
indexes' pages (PEP 691 JSON or PEP 503 HTML ``#sha256=`` fragments; a local file without one is
hashed here). A file served by two indexes under one name with different digests is reported and
both are kept (a mirror's rebuild or a tampered copy: look before committing the lock).

Usage: scripts/lock_requirements.py [--python 3.10=/path/to/python3.10 ...] [--flavour cpu ...]
Interpreters: --python, else pythonX.Y on PATH if it runs, else the newest
~/.pyenv/versions/X.Y.*/bin/pythonX.Y. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import html.parser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "requirements"
LOCK_DIR = REQ / "lock"
FLAVOURS = {
    "cpu": ["base.txt", "build.txt", "tf-cpu.txt"],
    "gpu": ["base.txt", "build.txt", "gpu.txt"],
    "no-deps": ["no-deps.txt"],
}
PYPI = "https://pypi.org/simple"


def supported_pythons() -> list[str]:
    """The versions scripts/python_choice.sh accepts (its SUPPORTED line)."""
    text = (ROOT / "scripts" / "python_choice.sh").read_text()
    return re.search(r'^SUPPORTED="([0-9. ]+)"', text, re.M).group(1).split()


def inputs_digest(flavour: str) -> str:
    """sha256 (16 hex) of the requirement files a lock is made from, written in its header."""
    h = hashlib.sha256()
    for name in FLAVOURS[flavour]:
        h.update((REQ / name).read_bytes())
    return h.hexdigest()[:16]


def lock_path(version: str, flavour: str) -> Path:
    return LOCK_DIR / f"py{version.replace('.', '')}-{flavour}.txt"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_python(version: str) -> str | None:
    """pythonX.Y on PATH if it runs as that version, else the newest pyenv build of it."""
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    candidates = [shutil.which(f"python{version}")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(
        glob.glob(f"{pyenv}/{version}.*/bin/python{version}"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parts[-3])])[::-1]
    for cand in filter(None, candidates):
        out = subprocess.run([cand, "-c", probe], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip() == version:
            return cand
    return None


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def _read(url: str) -> tuple[bytes, str]:
    req = urllib.request.Request(url, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


def _sha256_of(url: str) -> str:
    h = hashlib.sha256()
    if url.startswith("file://"):
        with open(urllib.parse.unquote(urllib.parse.urlparse(url).path), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    else:
        with urllib.request.urlopen(url, timeout=600) as resp:
            for block in iter(lambda: resp.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class Indexes:
    """The files pip's configured indexes and find-links serve, by canonical project name."""

    def __init__(self, index_urls: list[str], find_links: list[str]) -> None:
        self.index_urls = index_urls
        self.find_links = find_links
        self._cache: dict[str, list[tuple[str, str, str | None]]] = {}
        self._flat: list[tuple[str, str, str | None]] | None = None

    @classmethod
    def from_pip(cls, python: str) -> "Indexes":
        """index-url / extra-index-url / find-links as `pip config list` reports them."""
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                             text=True, check=True).stdout
        index, extra, links = [PYPI], [], []
        for line in out.splitlines():
            key, _, value = line.partition("=")
            values = shlex.split(value.strip().strip("'\"").replace("\\n", " "))
            if key.endswith(".index-url"):
                index = values
            elif key.endswith(".extra-index-url"):
                extra += values
            elif key.endswith(".find-links"):
                links += values
        for var, target in (("PIP_INDEX_URL", None), ("PIP_EXTRA_INDEX_URL", extra),
                            ("PIP_FIND_LINKS", links)):
            if os.environ.get(var):
                if target is None:
                    index = os.environ[var].split()
                else:
                    target += os.environ[var].split()
        return cls(index + extra, links)

    def _page(self, base: str, project: str) -> list[tuple[str, str, str | None]]:
        """(filename, url, sha256 or None) for one project on one simple index."""
        url = base.rstrip("/") + f"/{project}/"
        if url.startswith("file://"):
            folder = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
            page = folder / "index.html"
            if not page.is_file():
                return []
            body, ctype = page.read_bytes(), "text/html"
        else:
            try:
                body, ctype = _read(url)
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return []
                raise
        files = []
        if "json" in ctype:
            for f in json.loads(body)["files"]:
                files.append((f["filename"], urllib.parse.urljoin(url, f["url"]),
                              f.get("hashes", {}).get("sha256")))
            return files
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        for href in parser.links:
            full = urllib.parse.urljoin(url, href)
            link, _, frag = full.partition("#")
            digest = frag[len("sha256="):] if frag.startswith("sha256=") else None
            files.append((urllib.parse.unquote(link.rsplit("/", 1)[-1]), link, digest))
        return files

    def _flat_links(self) -> list[tuple[str, str, str | None]]:
        if self._flat is None:
            self._flat = []
            for loc in self.find_links:
                path = Path(loc[len("file://"):] if loc.startswith("file://") else loc)
                if path.is_dir():
                    self._flat += [(p.name, p.as_uri(), None) for p in sorted(path.iterdir())]
                elif "://" in loc:
                    parser = _Links()
                    parser.feed(_read(loc)[0].decode("utf-8", "replace"))
                    for href in parser.links:
                        link, _, frag = urllib.parse.urljoin(loc, href).partition("#")
                        self._flat.append((link.rsplit("/", 1)[-1], link,
                                           frag[7:] if frag.startswith("sha256=") else None))
        return self._flat

    def files(self, project: str) -> list[tuple[str, str, str | None]]:
        project = canonical(project)
        if project not in self._cache:
            found = []
            for base in self.index_urls:
                found += self._page(base, project)
            found += [f for f in self._flat_links() if f[0].endswith(".whl")
                      and canonical(f[0].split("-")[0]) == project]
            self._cache[project] = found
        return self._cache[project]


def wheel_fits(filename: str, version: str, pairs: set[tuple[str, str]]) -> str | None:
    """The version in a wheel's name if the wheel runs on Linux with one of (interpreter, abi)
    pairs, else None."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        return None
    pys, abis, plats = parts[-3].split("."), parts[-2].split("."), parts[-1].split(".")
    if not any(p == "any" or p.startswith(("manylinux", "linux_")) for p in plats):
        return None
    if not any((py, abi) in pairs for py in pys for abi in abis):
        return None
    return parts[1]


def _norm_version(v: str) -> str:
    return re.sub(r"(\.0+)+$", "", v.lower().replace("_", "-"))


def resolve(python: str, version: str, flavour: str,
            work: Path) -> tuple[list[tuple[str, str]], set, str]:
    """(name, version) pins pip resolves for these requirements with this Python, the Python's
    (interpreter, abi) tag pairs, and the pip version used."""
    venv = work / "venv"
    if not venv.exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    vpy = str(venv / "bin" / "python")
    report = work / f"report-{flavour}.json"
    # --python-version X.Y: Requires-Python is checked against X.Y.0, so the lock installs on
    # every X.Y.z (Debian 12's python3 is 3.11.2: a lock resolved by a 3.11.7 held
    # soupsieve 4.1.3, which requires >=3.11.5); --target goes with it and, in a dry run, is
    # never written
    cmd = [vpy, "-m", "pip", "--disable-pip-version-check", "install", "--dry-run",
           "--target", str(work / "target"), "--python-version", version,
           "--only-binary", ":all:", "--quiet", "--report", str(report)]
    if flavour == "no-deps":
        cmd.append("--no-deps")
    for name in FLAVOURS[flavour]:
        cmd += ["-r", str(REQ / name)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"pip could not resolve {flavour} for {python}:\n{proc.stderr}")
    pins = sorted((canonical(i["metadata"]["name"]), i["metadata"]["version"])
                  for i in json.loads(report.read_text())["install"])
    tags = subprocess.run([vpy, "-c", "from pip._vendor.packaging.tags import sys_tags\n"
                           "for t in sys_tags(): print(t.interpreter, t.abi)"],
                          capture_output=True, text=True, check=True).stdout
    pairs = {tuple(line.split()) for line in tags.splitlines()}
    pip_version = subprocess.run([vpy, "-m", "pip", "--version"], capture_output=True,
                                 text=True).stdout.split()[1]
    return pins, pairs, pip_version


def digests(indexes: Indexes, name: str, version: str, pairs: set) -> list[str]:
    """sha256 of every fitting wheel of name==version the indexes serve (sorted, unique)."""
    by_file: dict[str, dict[str, str]] = {}
    for filename, url, digest in indexes.files(name):
        v = wheel_fits(filename, version, pairs)
        if v is None or _norm_version(v) != _norm_version(version):
            continue
        by_file.setdefault(filename, {})[digest or _sha256_of(url)] = url
    for filename, seen in by_file.items():
        if len(seen) > 1:
            print(f"  WARNING: {filename} is served with {len(seen)} different contents: "
                  + "; ".join(f"{d[:12]} at {u}" for d, u in seen.items()), file=sys.stderr)
    return sorted({d for seen in by_file.values() for d in seen})


def write_lock(version: str, flavour: str, python: str, pip_version: str,
               pins: list[tuple[str, str]], indexes: Indexes, pairs: set) -> Path:
    inputs = ", ".join(f"requirements/{n}" for n in FLAVOURS[flavour])
    lines = [
        f"# Hash-locked {flavour} requirements for CPython {version} "
        f"(every {version}.z) on Linux:",
        "# generated by `make lock`",
        "# (scripts/lock_requirements.py), do not edit: change the pins and run it again.",
        f"# from: {inputs}",
        f"# inputs-sha256: {inputs_digest(flavour)}",
        f"# resolved by pip {pip_version}; each --hash is a Linux wheel for this Python that the",
        "# configured package indexes serve for that version; make setup installs this file with",
        "# pip install --require-hashes --only-binary :all:"
        + (" --no-deps" if flavour == "no-deps" else ""),
    ]
    for name, ver in pins:
        hashes = digests(indexes, name, ver, pairs)
        if not hashes:
            sys.exit(f"no wheel of {name}=={ver} for Python {version} found on the indexes "
                     f"({', '.join(indexes.index_urls)})")
        lines.append(f"{name}=={ver} \\")
        lines += [f"    --hash=sha256:{d} \\" for d in hashes[:-1]]
        lines.append(f"    --hash=sha256:{hashes[-1]}")
    out = lock_path(version, flavour)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", default=[], metavar="X.Y=PATH",
                    help="interpreter for one version (default: found on PATH or in pyenv)")
    ap.add_argument("--flavour", action="append", choices=sorted(FLAVOURS),
                    help="only these flavours (default: all)")
    ap.add_argument("--version", action="append", dest="versions", metavar="X.Y",
                    help="only these Python versions (default: all supported)")
    args = ap.parse_args(argv)
    given = dict(p.split("=", 1) for p in args.python)
    versions = args.versions or supported_pythons()
    flavours = args.flavour or list(FLAVOURS)
    missing, indexes = [], None
    for version in versions:
        python = given.get(version) or find_python(version)
        if not python:
            missing.append(version)
            continue
        with tempfile.TemporaryDirectory(prefix=f"lock-py{version}-") as tmp:
            for flavour in flavours:
                pins, pairs, pip_version = resolve(python, version, flavour, Path(tmp))
                indexes = indexes or Indexes.from_pip(str(Path(tmp) / "venv" / "bin" / "python"))
                out = write_lock(version, flavour, python, pip_version, pins, indexes, pairs)
                print(f"{out.relative_to(ROOT)}: {len(pins)} packages ({python})")
    if missing:
        print(f"no interpreter for Python {', '.join(missing)}: pass --python X.Y=/path "
              "(those locks were not rewritten)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
