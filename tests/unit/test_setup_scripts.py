"""The setup scripts (issue 17): syntax, and the system-package table without installing anything.

``scripts/system_packages.sh`` is run with a PATH that holds only a temporary folder of fake
tools (``g++``, ``git``, ``mpirun``, ``mpicc``, ``chromium``, ``python3.11``, ``id``, ``apt-get``),
so each case decides exactly what is "installed", whether this is root, and what ``apt-get`` does;
the fake ``apt-get`` only records its arguments. Nothing here needs root, apt or a network.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
SYSTEM_PACKAGES = SCRIPTS / "system_packages.sh"
BASH = "/bin/bash"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ALL_TOOLS = ("python3.11", "g++", "git", "mpirun", "mpicc", "chromium")
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'
UBUNTU = 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n'
DEBIAN13 = 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\nVERSION_ID="13"\n'
ROCKY = ('PRETTY_NAME="Rocky Linux 9.4"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'
         'VERSION_ID="9.4"\n')


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def fake(tmp_path):
    """A fake system: ``fake.make(tools, uid=..., os_release=..., apt_installs=...)``."""

    class Fake:
        bin = tmp_path / "bin"
        apt_log = tmp_path / "apt.log"
        os_release = tmp_path / "os-release"

        def make(self, tools=ALL_TOOLS, uid=0, os_release=DEBIAN, venv_ok=True, apt_installs=()):
            self.bin.mkdir(exist_ok=True)
            for name in tools:
                # the venv check runs: python3.11 -c 'import ensurepip...'
                if name == "python3.11":
                    _tool(self.bin / name, "exit 0" if venv_ok else "exit 1")
                else:
                    _tool(self.bin / name, "exit 0")
            _tool(self.bin / "id", f"echo {uid}")
            # apt-get records its arguments; "install" may create the tools it is told to
            creates = "".join(
                f'\nprintf "#!/bin/sh\\nexit 0\\n" > "{self.bin}/{t}"; '
                f'/bin/chmod +x "{self.bin}/{t}"'
                for t in apt_installs)
            _tool(self.bin / "apt-get", f'echo "$*" >> "{self.apt_log}"\n'
                                        f'[ "$1" = update ] && exit 0{creates}\nexit 0')
            self.os_release.write_text(os_release)

        def run(self, *args, **env):
            full_env = {"PATH": str(self.bin), "OS_RELEASE": str(self.os_release),
                        "PYTHON": "python3.11", **env}
            proc = subprocess.run([BASH, str(SYSTEM_PACKAGES), *args], env=full_env,
                                  capture_output=True, text=True, timeout=30)
            return proc.returncode, ANSI.sub("", proc.stdout + proc.stderr)

        def apt_calls(self):
            return self.apt_log.read_text().splitlines() if self.apt_log.exists() else []

    return Fake()


@pytest.mark.parametrize("script", ["setup.sh", "system_packages.sh", "fresh_check.sh",
                                    "python_choice.sh", "digests.sh", "python_matrix.sh"])
def test_scripts_parse(script):
    proc = subprocess.run([BASH, "-n", str(SCRIPTS / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_everything_present_asks_for_nothing(fake):
    fake.make()
    for args in ([], ["--check-only"]):
        code, out = fake.run(*args)
        assert code == 0, out
        assert "system packages present" in out
        assert "missing" not in out and "apt-get" not in out
    assert fake.apt_calls() == []   # not even apt-get update


def test_missing_compiler_named_with_exact_apt_line(fake):
    fake.make(tools=("python3.11", "git", "mpirun", "mpicc", "chromium"))
    code, out = fake.run("--check-only")
    assert code == 1
    assert "g++ (package g++) is missing" in out
    assert "sudo apt-get update && sudo apt-get install -y g++\n" in out
    assert fake.apt_calls() == []


def test_everything_missing_lists_every_package_in_one_line(fake):
    fake.make(tools=("python3.11",), venv_ok=False)
    code, out = fake.run("--check-only")
    assert code == 1
    line = "sudo apt-get install -y python3.11-venv g++ git openmpi-bin libopenmpi-dev chromium"
    assert line in out
    assert "the venv module of python3.11 (package python3.11-venv) is missing" in out


def test_missing_git_is_named_because_the_horovod_patches_need_it(fake):
    fake.make(tools=tuple(t for t in ALL_TOOLS if t != "git"))
    code, out = fake.run("--check-only")
    assert code == 1
    assert "git (package git) is missing" in out
    assert "sudo apt-get update && sudo apt-get install -y git\n" in out


def test_venv_module_only_needed_when_a_venv_is_made(fake):
    fake.make(venv_ok=False)
    code, out = fake.run("--check-only", SETUP_NEEDS_VENV="0")
    assert code == 0 and "venv" not in out
    code, out = fake.run("--check-only", PYTHON="python3.11")
    assert code == 1 and "package python3.11-venv" in out


def test_only_chromium_missing_is_not_fatal(fake):
    fake.make(tools=("python3.11", "g++", "git", "mpirun", "mpicc"))
    code, out = fake.run("--check-only")
    assert code == 0
    assert "Chromium (package chromium) is missing" in out
    assert "sudo apt-get install -y chromium" in out


def test_ubuntu_chromium_is_a_snap_shim_so_no_apt_line(fake):
    fake.make(tools=("python3.11", "g++", "git", "mpirun", "mpicc"), os_release=UBUNTU)
    code, out = fake.run()           # root, install mode: still no apt call for a snap shim
    assert code == 0
    assert "snap" in out and "apt-get install" not in out
    assert fake.apt_calls() == []


def test_not_debian_or_ubuntu_gives_no_apt_line(fake):
    fake.make(tools=("python3.11", "git", "mpirun", "mpicc", "chromium"), os_release="ID=arch\n")
    code, out = fake.run()
    assert code == 1
    assert "g++ (package g++) is missing" in out and "not Debian or Ubuntu" in out
    assert "apt-get install" not in out and "dnf" not in out and fake.apt_calls() == []


def test_the_rhel_family_gets_the_dnf_line_with_its_package_names(fake):
    fake.make(tools=("python3.11",), venv_ok=False, os_release=ROCKY)
    code, out = fake.run()
    assert code == 1 and fake.apt_calls() == []
    assert "g++ (package gcc-c++) is missing" in out and "mpicc (package openmpi-devel)" in out
    assert ("    sudo dnf install -y python3.11 gcc-c++ git openmpi openmpi-devel chromium\n"
            in out)
    assert "module load mpi/openmpi-$(uname -m)" in out and "EPEL" in out


def test_the_venv_package_follows_the_version_python_reports(fake):
    """Debian 13's python3 is 3.13: its venv module is python3.13-venv, not python3-venv."""
    fake.make(tools=("g++", "git", "mpirun", "mpicc", "chromium"), os_release=DEBIAN13)
    _tool(fake.bin / "python3", 'case "$2" in *ensurepip*) exit 1 ;; *) echo 3.13 ;; esac')
    code, out = fake.run("--check-only", PYTHON="python3")
    assert code == 1
    assert "the venv module of python3 (package python3.13-venv) is missing" in out
    assert "sudo apt-get update && sudo apt-get install -y python3.13-venv\n" in out


def test_not_root_prints_the_line_and_installs_nothing(fake):
    fake.make(tools=("python3.11", "chromium"), uid=1000)
    code, out = fake.run()
    assert code == 1
    assert ("sudo apt-get update && sudo apt-get install -y g++ git openmpi-bin libopenmpi-dev"
            in out)
    assert "this is not root" in out
    assert fake.apt_calls() == []


def test_root_installs_with_one_update_then_checks_again(fake):
    fake.make(tools=("python3.11", "git", "mpirun", "mpicc", "chromium"), apt_installs=("g++",))
    code, out = fake.run()
    assert code == 0, out
    assert fake.apt_calls() == ["update -qq", "install -y -qq g++"]
    assert "system packages installed: g++" in out


def test_root_names_what_apt_did_not_bring(fake):
    # apt-get "succeeds" but no g++ appears: the check after the install names the package
    fake.make(tools=("python3.11", "chromium"), apt_installs=("mpirun", "mpicc"))
    code, out = fake.run()
    assert code == 1
    assert fake.apt_calls() == [
        "update -qq", "install -y -qq g++ git openmpi-bin libopenmpi-dev"]
    assert "g++ (package g++) is missing: `command -v g++` fails after apt-get install" in out
    assert "mpirun (package openmpi-bin) is missing" not in out


def test_horovod_build_uses_the_environments_cmake():
    """The wheel build command sets HOROVOD_CMAKE and PATH to the venv's bin/ (issue 17)."""
    text = (SCRIPTS / "setup.sh").read_text()
    commands = re.sub(r"\\\n\s*", " ", text).splitlines()
    build = [c for c in commands if '"${PIP[@]}" wheel' in c]
    assert len(build) == 1, build
    assert 'HOROVOD_CMAKE="$BIN_DIR/cmake"' in build[0] and 'PATH="$BIN_DIR:$PATH"' in build[0]


def test_horovod_sdist_download_builds_no_isolated_environment():
    """Review N5: ``pip download`` of Horovod's sdist prepares its metadata with this
    environment's hashed setuptools, never in an isolated build environment filled from the
    index without hash checks."""
    text = (SCRIPTS / "setup.sh").read_text()
    commands = re.sub(r"\\\n\s*", " ", text).splitlines()
    download = [c for c in commands if '"${PIP[@]}" download' in c]
    assert len(download) == 1 and "--no-build-isolation" in download[0], download
    assert "--require-hashes" in download[0]


def test_make_lint_and_the_lab_hint_in_a_checkout_path_with_a_space(tmp_path):
    """Review N7: every command of ``make lint`` names the venv's tools with the checkout's
    path whole, and ``make lab PRIVATE=1`` quotes the socket path in its ssh hint."""
    checkout = tmp_path / "a b"
    checkout.mkdir()
    (checkout / "Makefile").write_text((ROOT / "Makefile").read_text())
    out = subprocess.run(["make", "-n", "lint"], cwd=checkout, capture_output=True, text=True,
                         check=True).stdout
    tools = [line for line in out.splitlines() if ".venv/bin/" in line]
    assert len(tools) == 3 and all(f'"{checkout}/.venv/bin/' in line for line in tools), out
    lab = subprocess.run(["make", "-n", "lab", "PRIVATE=1"], cwd=checkout, capture_output=True,
                         text=True, check=True).stdout
    assert "ssh -L '8888:$sock'" in lab, lab


def test_ci_runs_fresh_check_after_the_tests():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    stages = [(i, line) for i, line in enumerate(lines) if line.startswith("stage ")]
    first = {cmd: next(i for i, line in stages if cmd in line)
             for cmd in ("make test ", "make fresh-check SUITE=bookworm",
                         "make fresh-check SUITE=trixie")}
    # Debian 12 first, then Debian 13 (issue 26)
    assert first["make test "] < first["make fresh-check SUITE=bookworm"] \
        < first["make fresh-check SUITE=trixie"]
    assert any("make nonroot-check" in line for _, line in stages)
    assert any("make gpu-build-check" in line for _, line in stages)
    assert "fresh-check:" in (ROOT / "Makefile").read_text()


def test_fresh_check_takes_only_the_two_debian_releases():
    proc = subprocess.run([BASH, str(SCRIPTS / "fresh_check.sh")], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "SUITE": "sid"})
    assert proc.returncode == 2
    assert "SUITE must be bookworm (Debian 12) or trixie (Debian 13), not sid" in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="as root it would really start")
def test_fresh_check_refuses_without_root():
    proc = subprocess.run([BASH, str(SCRIPTS / "fresh_check.sh")], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode != 0 and "needs root" in proc.stderr
