"""#46 item 4 (the earlier review's #12): Jupyter's ``--allow-root`` and Open MPI's allow-root
switches only in a container, in a user namespace of one's own, or with ``CHEXNET_ALLOW_ROOT=1``;
as the host's root otherwise, one line saying what to do, and nothing is switched."""

from __future__ import annotations

from pathlib import Path

import pytest

from chexnet_utils import lab
from chexnet_utils.cluster import distributed
from chexnet_utils.platform import root
from chexnet_utils.platform.root import RootRefused, root_switches


@pytest.fixture
def host_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as the host's root, outside any container, without the opt-in."""
    monkeypatch.setattr(root.os, "geteuid", lambda: 0)
    monkeypatch.setattr(root, "host_root", lambda uid_map=None: True)
    monkeypatch.setattr(root, "in_container", lambda env=None, root=None: False)
    monkeypatch.delenv(root.ALLOW_ROOT_ENV, raising=False)


def test_the_hosts_root_is_refused_in_one_line(host_root: None) -> None:
    with pytest.raises(RootRefused) as e:
        root_switches()
    message = str(e.value)
    assert "\n" not in message and "as a normal user" in message
    assert "CHEXNET_ALLOW_ROOT=1" in message
    with pytest.raises(RootRefused):          # no Open MPI switches ...
        distributed.mpi_env_overrides(2, {})
    with pytest.raises(RootRefused):          # ... and no --allow-root
        lab.lab_args("notebooks")


def test_the_opt_in_a_container_or_a_namespace_of_ones_own_allow_it(
        host_root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert root_switches({root.ALLOW_ROOT_ENV: "1"})
    monkeypatch.setenv(root.ALLOW_ROOT_ENV, "1")
    assert "--allow-root" in lab.lab_args("notebooks")
    env = distributed.mpi_env_overrides(2, {root.ALLOW_ROOT_ENV: "1"})
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    monkeypatch.delenv(root.ALLOW_ROOT_ENV)
    monkeypatch.setattr(root, "in_container", lambda env=None, root=None: True)
    assert root_switches({})
    monkeypatch.setattr(root, "in_container", lambda env=None, root=None: False)
    monkeypatch.setattr(root, "host_root", lambda uid_map=None: False)  # mapped root
    assert root_switches({})


def test_not_root_needs_no_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(root.os, "geteuid", lambda: 1000)
    assert root_switches({}) is False
    assert "--allow-root" not in lab.lab_args("notebooks")


def test_what_counts_as_a_container_and_as_the_hosts_root(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    assert not root.in_container({}, tmp_path)
    assert root.in_container({"container": "podman"}, tmp_path)
    (tmp_path / ".dockerenv").write_text("")
    assert root.in_container({}, tmp_path)
    monkeypatch.setattr(root.os, "geteuid", lambda: 0)
    uid_map = tmp_path / "uid_map"
    uid_map.write_text("         0          0 4294967295\n")
    assert root.host_root(uid_map)
    uid_map.write_text("         0       1000          1\n")   # unshare --map-root-user
    assert not root.host_root(uid_map)


def test_fresh_check_opts_in_where_it_runs_the_notebook_as_root() -> None:
    """The bare Debian's chroot is no container: fresh-check runs notebook 00 as root with
    the opt-in, as the README tells a root user to."""
    script = (Path(__file__).resolve().parents[2] / "scripts" / "fresh_check.sh").read_text()
    line = next(line for line in script.splitlines() if "in_root" in line
                and "CHEXNET_ALLOW_ROOT=1" in line)
    assert "/bin/bash -c" in line
