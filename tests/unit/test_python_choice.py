"""Which Python `make setup` uses (issue 26): scripts/python_choice.sh and setup.sh's stops.

Fake interpreters in a temporary folder answer the two probes the scripts run (the version
with the real executable, and "X.Y"); an os-release file decides the distribution. The stops
of scripts/setup.sh run the real script, with a fake ``apt-get`` that records any call: the
point is that it stops before installing anything.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHOICE = ROOT / "scripts" / "python_choice.sh"
SETUP = ROOT / "scripts" / "setup.sh"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
OS = {
    "debian12": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
    "debian13": 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\nVERSION_ID="13"\n',
    "ubuntu22": 'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nID=ubuntu\nID_LIKE=debian\n'
                'VERSION_ID="22.04"\n',
    "ubuntu24": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\nID_LIKE=debian\n'
                'VERSION_ID="24.04"\n',
    "rocky9": 'PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"\nID="rocky"\n'
              'ID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n',
    "arch": 'PRETTY_NAME="Arch Linux"\nID=arch\n',
}
ACCEPTED = "make setup needs CPython 3.10, 3.11, 3.12 or 3.13"


def fake_python(path: Path, version: str, impl: str = "cpython") -> Path:
    """An interpreter that answers the scripts' probes as Python ``version`` would."""
    full = version if impl == "cpython" else f"{impl} {version}"
    xy = ".".join(version.split(".")[:2])
    path.write_text("#!/bin/sh\n"
                    'case "$2" in *executable*) printf "%s\\t%s\\n" '
                    f'"{full}" "{path}" ;; *) echo {xy} ;; esac\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def system(tmp_path):
    """``system(pythons={"python3.13": "3.13.5"}, os="debian13")`` -> run(**env)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os_release = tmp_path / "os-release"

    def make(pythons: dict[str, str], os_name: str = "debian12"):
        for name, version in pythons.items():
            if version == "broken":          # a pyenv shim for a version that is not installed
                (bin_dir / name).write_text(
                    "#!/bin/sh\necho 'pyenv: not installed' >&2\nexit 127\n")
                (bin_dir / name).chmod(0o755)
            elif version.startswith("pypy"):
                fake_python(bin_dir / name, version.split()[1], impl="pypy")
            else:
                fake_python(bin_dir / name, version)
        os_release.write_text(OS[os_name])

        def run(**env):
            full = {"PATH": str(bin_dir), "OS_RELEASE": str(os_release), **env}
            proc = subprocess.run(["/bin/bash", str(CHOICE)], env=full, capture_output=True,
                                  text=True, timeout=30)
            return proc.returncode, proc.stdout, ANSI.sub("", proc.stderr)
        return run

    make.bin = bin_dir
    return make


def test_the_newest_supported_python_on_path_is_chosen(system):
    run = system({"python3.13": "broken", "python3.12": "3.12.3", "python3.11": "3.11.2",
                  "python3": "3.12.3"}, "ubuntu24")
    code, out, err = run()
    assert code == 0, err
    name, path, version = out.rstrip("\n").split("\t")
    assert (name, version) == ("python3.12", "3.12.3") and path.endswith("/python3.12")


def test_python3_is_taken_when_it_is_the_only_one_and_supported(system):
    run = system({"python3": "3.13.5"}, "debian13")
    code, out, _ = run()
    assert code == 0 and out.split("\t")[0] == "python3" and out.rstrip().endswith("3.13.5")


def test_pythons_outside_the_range_are_skipped(system):
    run = system({"python3.14": "3.14.0", "python3": "3.14.0", "python3.10": "3.10.12"},
                 "ubuntu22")
    code, out, _ = run(PYTHON_CANDIDATES="python3.14 python3.13 python3.10 python3")
    assert code == 0 and out.split("\t")[0] == "python3.10"


@pytest.mark.parametrize("os_name, line", [
    ("debian12", "sudo apt-get install -y python3.11 python3.11-venv"),
    ("debian13", "sudo apt-get install -y python3.13 python3.13-venv"),
    ("ubuntu22", "sudo apt-get install -y python3.10 python3.10-venv"),
    ("ubuntu24", "sudo apt-get install -y python3.12 python3.12-venv"),
    ("rocky9", "sudo dnf install -y python3.12 python3.12-devel"),
])
def test_python_39_stops_with_the_accepted_versions_and_this_distributions_package(
        system, os_name, line):
    run = system({"python3.9": "3.9.18"}, os_name)
    code, out, err = run(PYTHON="python3.9")
    assert code == 1 and out == ""
    assert f"PYTHON=python3.9 is Python 3.9.18. {ACCEPTED}" in err
    assert "nothing was installed" in err
    assert f"    {line}\n" in err


def test_python_314_and_no_python_at_all(system):
    run = system({"python3.14": "3.14.0", "python3": "3.14.0"}, "ubuntu24")
    code, out, err = run(PYTHON="python3.14")
    assert code == 1 and "PYTHON=python3.14 is Python 3.14.0." in err and ACCEPTED in err
    code, out, err = run()
    assert code == 1 and out == ""
    assert "no usable Python among python3.13, python3.12, python3.11, python3.10, python3" in err
    assert "python3 is Python 3.14.0" in err
    assert "sudo apt-get install -y python3.12 python3.12-venv" in err


def test_an_unknown_system_is_pointed_at_conda(system):
    run = system({"python3": "3.9.2"}, "arch")
    code, _, err = run()
    assert code == 1 and ACCEPTED in err and "conda: environment.yml" in err
    assert "apt-get" not in err and "dnf" not in err


def test_a_missing_python_and_pypy_are_named(system):
    run = system({"pypy3": "pypy 3.10.14"}, "debian12")
    code, _, err = run(PYTHON="python3.12")
    assert code == 1 and "PYTHON=python3.12 is not found" in err
    code, _, err = run(PYTHON="pypy3")
    assert code == 1 and "PYTHON=pypy3 is Python pypy 3.10.14" in err


# --- scripts/setup.sh: stops before anything is installed -----------------------------------

def _setup(system_fixture, tmp_path, venv: Path, **env):
    """The real setup.sh with fake pythons first on PATH and an apt-get that records calls."""
    apt_log = tmp_path / "apt.log"
    apt = system_fixture.bin / "apt-get"
    apt.write_text(f'#!/bin/sh\necho "$*" >> "{apt_log}"\nexit 0\n')
    apt.chmod(0o755)
    full = {"PATH": f"{system_fixture.bin}:{os.environ['PATH']}", "HOME": str(tmp_path),
            "VENV": str(venv), "OS_RELEASE": str(tmp_path / "os-release"),
            "CHEXNET_CACHE": str(tmp_path / "cache"), "GPU": "0", **env}
    proc = subprocess.run(["/bin/bash", str(SETUP)], env=full, capture_output=True, text=True,
                          timeout=60)
    return proc, apt_log


def test_setup_with_python_39_stops_at_once_and_installs_nothing(system, tmp_path):
    system({"python3.9": "3.9.18"}, "debian12")
    venv = tmp_path / "venv"
    proc, apt_log = _setup(system, tmp_path, venv, PYTHON="python3.9")
    err = ANSI.sub("", proc.stderr)
    assert proc.returncode == 1, proc.stdout + err
    assert f"PYTHON=python3.9 is Python 3.9.18. {ACCEPTED}" in err
    assert "sudo apt-get install -y python3.11 python3.11-venv" in err
    assert not venv.exists() and not apt_log.exists() and not (tmp_path / "cache").exists()
    assert "[setup]" not in ANSI.sub("", proc.stdout)   # not even the system-package check ran


def test_setup_refuses_to_mix_a_second_python_into_an_environment(system, tmp_path):
    system({"python3.13": "3.13.5"}, "debian13")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake_python(venv / "bin" / "python", "3.11.2")
    (venv / ".chexnet-python").write_text("python3.11\t/usr/bin/python3.11\t3.11.2\n")
    before = sorted(p.name for p in venv.rglob("*"))
    proc, apt_log = _setup(system, tmp_path, venv, PYTHON="python3.13")
    err = ANSI.sub("", proc.stderr)
    assert proc.returncode == 1
    assert (f"{venv} was made with Python 3.11 (python3.11 (/usr/bin/python3.11, 3.11.2)); "
            "PYTHON=python3.13 is Python 3.13.5") in err
    assert "setup does not mix two Pythons in one environment" in err
    assert "VENV=.venv-py313" in err
    assert sorted(p.name for p in venv.rglob("*")) == before and not apt_log.exists()
