"""The Slurm rows of scripts/system_packages.sh (SETUP_SLURM=1, what setup.sh passes), with the
fake system of tests/unit/test_setup_scripts.py: nothing installed for real."""

from __future__ import annotations

from tests.unit import test_setup_scripts as base

ALL_TOOLS = base.ALL_TOOLS
fake = base.fake  # the fixture: a PATH of fake tools, a fake apt-get

SLURM_TOOLS = ("sbatch", "slurmctld", "slurmd", "munged")


def test_missing_slurm_is_optional_and_named_with_its_apt_line(fake):
    fake.make(tools=ALL_TOOLS, uid=1000)
    code, out = fake.run(SETUP_SLURM="1", SBIN_DIRS=str(fake.bin))
    assert code == 0, out  # optional: setup goes on, the Slurm tests skip
    assert "Slurm (sbatch, slurmctld, slurmd) (package slurm-wlm) is missing" in out
    assert "munged (package munge) is missing" in out
    assert "sudo apt-get update && sudo apt-get install -y slurm-wlm munge\n" in out
    assert "test_slurm.py" in out and fake.apt_calls() == []


def test_root_installs_slurm_and_munge(fake):
    fake.make(tools=ALL_TOOLS, apt_installs=SLURM_TOOLS)
    code, out = fake.run(SETUP_SLURM="1", SBIN_DIRS=str(fake.bin))
    assert code == 0, out
    assert fake.apt_calls() == ["update -qq", "install -y -qq slurm-wlm munge"]


def test_slurm_rows_only_when_asked(fake):
    fake.make(tools=ALL_TOOLS)
    code, out = fake.run("--check-only")
    assert code == 0 and "slurm" not in out.lower()
    code, out = fake.run("--check-only", SETUP_SLURM="1", SBIN_DIRS=str(fake.bin))
    assert "slurm-wlm" in out
