"""Hash-locked installs (issue 30 item 4): the locks, Horovod's sdist digest, the cached wheel.

scripts/digests.sh is what scripts/setup.sh runs before it unpacks Horovod's source and before
it installs a cached wheel: here it meets a good and a tampered copy of each (a fake ``python``
records whether pip would have been called). The locks are checked against the pins they are
made from, so a pin changed without `make lock` fails here.
"""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = ROOT / "scripts" / "digests.sh"
LOCKS = ROOT / "requirements" / "lock"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run(*args: str, cwd: Path | None = None):
    proc = subprocess.run(["/bin/bash", str(DIGESTS), *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)
    return proc.returncode, ANSI.sub("", proc.stdout + proc.stderr)


def _supported() -> list[str]:
    text = (ROOT / "scripts" / "python_choice.sh").read_text()
    return re.search(r'^SUPPORTED="([0-9. ]+)"', text, re.M).group(1).split()


# --- Horovod's sdist --------------------------------------------------------------------------

@pytest.fixture
def sdist(tmp_path):
    """A small horovod-0.28.1.tar.gz and its sha256."""
    tarball = tmp_path / "horovod-0.28.1.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        data = b"print('setup')\n"
        info = tarfile.TarInfo("horovod-0.28.1/setup.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return tarball, hashlib.sha256(tarball.read_bytes()).hexdigest()


def test_horovods_published_digest_is_written_in_the_repository():
    line = next(line for line in (ROOT / "requirements" / "horovod.txt").read_text().splitlines()
                if line.startswith("horovod=="))
    # PyPI's sha256 of horovod-0.28.1.tar.gz (https://pypi.org/simple/horovod/)
    assert line == ("horovod==0.28.1 --hash=sha256:"
                    "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0")


def test_the_sdist_is_unpacked_when_its_digest_matches(sdist, tmp_path):
    tarball, digest = sdist
    dest = tmp_path / "src"
    dest.mkdir()
    code, out = _run("unpack-sdist", str(tarball), digest, str(dest))
    assert code == 0, out
    assert (dest / "horovod-0.28.1" / "setup.py").read_text() == "print('setup')\n"


def test_a_tampered_sdist_is_refused_and_nothing_is_unpacked(sdist, tmp_path):
    tarball, digest = sdist
    with open(tarball, "ab") as f:
        f.write(b"\0")                     # one byte more: another file
    dest = tmp_path / "src"
    dest.mkdir()
    code, out = _run("unpack-sdist", str(tarball), digest, str(dest))
    assert code == 1
    got = hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert (f"REFUSED: {tarball} is not Horovod's published source: its sha256 is {got}, "
            f"PyPI's digest for horovod-0.28.1.tar.gz (requirements/horovod.txt) is {digest}. "
            "Nothing was unpacked.") in out
    assert f"rm '{tarball}'" in out
    assert list(dest.iterdir()) == []


# --- the cached wheel -------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path):
    """A wheel cache entry as setup.sh leaves it: wheels/<key>/horovod-*.whl, sealed."""
    entry = tmp_path / "cache" / "wheels" / "horovod-0.28.1-pabc-tf2.21.0-cp311-openmpi4.1.4"
    entry.mkdir(parents=True)
    wheel = entry / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"PK\x03\x04 a wheel")
    code, out = _run("seal-wheel", str(wheel))
    assert code == 0, out
    python = tmp_path / "python"      # records a pip call instead of making one
    python.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/pip-calls"\n')
    python.chmod(0o755)
    return wheel, python, tmp_path / "pip-calls"


def test_a_sealed_wheel_has_a_read_only_digest_and_installs_with_require_hashes(cache):
    wheel, python, calls = cache
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    sealed = Path(f"{wheel}.sha256")
    assert sealed.read_text() == f"{digest}  {wheel.name}\n"
    assert oct(wheel.stat().st_mode & 0o777) == oct(sealed.stat().st_mode & 0o777) == "0o444"
    assert _run("verify-wheel", str(wheel))[0] == 0
    code, out = _run("install-wheel", str(wheel), str(python))
    assert code == 0, out
    assert calls.read_text().startswith(
        "-m pip --disable-pip-version-check install -q --require-hashes --no-deps "
        "--force-reinstall -r ")


def test_a_tampered_cached_wheel_is_refused_and_not_installed(cache):
    wheel, python, calls = cache
    wheel.chmod(0o644)
    wheel.write_bytes(b"PK\x03\x04 another wheel")
    wheel.chmod(0o444)
    code, out = _run("install-wheel", str(wheel), str(python))
    assert code == 1
    assert f"REFUSED: the cached Horovod wheel {wheel} was changed after it was built" in out
    assert "Nothing was installed" in out and f"rm -rf '{wheel.parent}' && make setup" in out
    assert not calls.exists()


def test_a_wheel_and_digest_others_can_rewrite_prove_nothing(cache):
    wheel, python, calls = cache
    Path(f"{wheel}.sha256").chmod(0o664)      # the group could rewrite wheel and digest together
    code, out = _run("install-wheel", str(wheel), str(python))
    assert code == 1 and "is writable by its group or by every account (mode 664)" in out
    assert not calls.exists()


def test_a_cached_wheel_without_a_digest_is_reported_for_a_rebuild(cache):
    wheel, python, calls = cache
    Path(f"{wheel}.sha256").unlink()
    code, out = _run("verify-wheel", str(wheel))
    assert code == 2 and "has no digest file" in out


def test_setup_checks_the_digests_before_unpacking_and_installing():
    """setup.sh unpacks the sdist and installs a cached wheel only through digests.sh, and
    installs every requirement from a lock with --require-hashes."""
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert "tar -x" not in text                 # only digests.sh unpacks
    assert "digests.sh unpack-sdist" in text and "digests.sh install-wheel" in text
    assert "digests.sh seal-wheel" in text
    assert not re.search(r'install[^\n]*"\$WHEEL_DIR"/horovod-\*\.whl', text.replace(
        'digests.sh install-wheel "$(ls "$WHEEL_DIR"/horovod-*.whl)"', ""))
    installs = [line for line in re.sub(r"\\\n\s*", " ", text).splitlines()
                if re.search(r'"\$\{PIP\[@\]\}" install', line)]
    assert installs and all("--require-hashes" in line
                            or line.endswith(" -e .")  # the project itself
                            for line in installs), installs
    assert "download" in text and "--require-hashes -d" in text


# --- the locks ---------------------------------------------------------------------------------

def _inputs_digest(names: list[str]) -> str:
    h = hashlib.sha256()
    for name in names:
        h.update((ROOT / "requirements" / name).read_bytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("flavour, inputs", [
    ("cpu", ["base.txt", "build.txt", "tf-cpu.txt"]),
    ("gpu", ["base.txt", "build.txt", "gpu.txt"]),
    ("no-deps", ["no-deps.txt"]),
])
@pytest.mark.parametrize("version", _supported())
def test_every_supported_python_has_a_current_lock_with_a_hash_on_every_pin(version, flavour,
                                                                           inputs):
    lock = LOCKS / f"py{version.replace('.', '')}-{flavour}.txt"
    assert lock.is_file(), f"{lock} is missing: make lock"
    text = lock.read_text()
    assert f"# inputs-sha256: {_inputs_digest(inputs)}\n" in text, \
        f"{lock.name} was made from other pins than requirements/{', '.join(inputs)}: make lock"
    entries = re.split(r"\n(?=[A-Za-z0-9])", re.sub(r"^(#.*\n)+", "", text).strip())
    assert entries
    for entry in entries:
        assert re.match(r"^[a-z0-9-]+==[^ ]+ \\\n", entry), entry[:80]
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), entry[:80]
    names = {e.split("==")[0] for e in entries}
    pinned = {re.split(r"[=\[;]", line)[0].lower().replace("_", "-")
              for name in inputs
              for line in (ROOT / "requirements" / name).read_text().splitlines()
              if line and not line.startswith("#")}
    assert pinned <= names, pinned - names    # every pin is in the lock (with its dependencies)


def test_environment_yml_accepts_the_versions_setup_accepts():
    text = (ROOT / "environment.yml").read_text()
    low, high = re.search(r"^\s*- python>=(3\.\d+),<(3\.\d+)\s*$", text, re.M).groups()
    supported = _supported()
    assert low == supported[0] and high == f"3.{int(supported[-1].split('.')[1]) + 1}"
    assert "- pip:" not in text      # no unchecked pip install: make setup CONDA=1 uses the lock


def test_the_lock_keeps_the_linux_wheels_this_python_can_install():
    fits = load_script("lock_requirements").wheel_fits
    cp313 = {("cp313", "cp313"), ("cp313", "abi3"), ("cp313", "none"), ("py3", "none"),
             ("cp312", "abi3")}
    assert fits("numpy-2.2.6-cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                "2.2.6", cp313) == "2.2.6"
    assert fits("numpy-2.2.6-cp313-cp313-manylinux_2_17_aarch64.whl", "2.2.6", cp313)  # any Linux
    assert fits("keras-3.15.1-py3-none-any.whl", "3.15.1", cp313) == "3.15.1"
    assert fits("cryptography-46.0.1-cp311-abi3-manylinux_2_34_x86_64.whl", "46.0.1",
                cp313 | {("cp311", "abi3")})
    assert fits("numpy-2.2.6-cp312-cp312-manylinux_2_17_x86_64.whl", "2.2.6", cp313) is None
    assert fits("numpy-2.2.6-cp313-cp313-win_amd64.whl", "2.2.6", cp313) is None
    assert fits("numpy-2.2.6-cp313-cp313-musllinux_1_2_x86_64.whl", "2.2.6", cp313) is None
    assert fits("numpy-2.2.6.tar.gz", "2.2.6", cp313) is None         # wheels only


def test_uv_looks_where_pip_is_configured_to_look_environment_first():
    args = load_script("pip_indexes").uv_index_args([
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
        "global.find-links='/opt/wheels'",
        "global.index-url='https://mirror.example/simple'",
        "install.index-url='https://install.example/simple'",
        ":env:.find-links='/env/wheels'",
    ])
    assert args == ["--index-url", "https://install.example/simple",
                    "--extra-index-url", "file:///opt/a/simple",
                    "--extra-index-url", "file:///opt/b/simple",
                    "--find-links", "/env/wheels"]
    assert load_script("pip_indexes").uv_index_args([]) == []   # pip's defaults are uv's: PyPI
    # docs/facilitator.md's offline room: PIP_NO_INDEX=1 PIP_FIND_LINKS=/shared/wheelhouse
    assert load_script("pip_indexes").uv_index_args(
        [":env:.no-index='1'", ":env:.find-links='/shared/wheelhouse'"]) == [
        "--no-index", "--find-links", "/shared/wheelhouse"]


def test_uv_is_pinned_by_digest_and_setup_falls_back_to_pip():
    pins = (ROOT / "requirements" / "uv.txt").read_text()
    assert re.search(r"^uv==[\d.]+ \\$", pins, re.M)
    assert len(re.findall(r"--hash=sha256:[0-9a-f]{64}", pins)) >= 2   # x86_64 and aarch64
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "--require-hashes --only-binary :all: -r requirements/uv.txt" in setup
    assert setup.count("--require-hashes --no-build") == 2        # both locks, hash-checked
    fallback = setup[setup.index("uv_install_locks \"$LOCK\""):]
    assert fallback.index('"${PIP[@]}" install -q --require-hashes') < fallback.index("\nfi")
