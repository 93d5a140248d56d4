"""What processes listen on, as ``ss -ltnp`` shows it (iproute2): the proof a test gives that
a cluster's listeners are where the docs say (loopback only, or exactly which are not)."""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from collections.abc import Iterable
from typing import NamedTuple

import pytest

_USERS = re.compile(r'\("([^"]*)",pid=(\d+),')


class Listener(NamedTuple):
    address: str   # "127.0.0.1", "0.0.0.0" / "*" (every interface), "[::1]", ...
    port: int
    pid: int
    name: str

    @property
    def loopback(self) -> bool:
        """True for a loopback address (127.0.0.0/8, ::1); False for every interface."""
        host = self.address.strip("[]").split("%")[0]
        if host in ("*", "0.0.0.0", "::"):
            return False
        return ipaddress.ip_address(host).is_loopback


def ss_listeners(pids: Iterable[int]) -> list[Listener]:
    """Every listening TCP socket of the processes ``pids`` in this network namespace, from
    ``ss -ltnpH`` (skips the test when ``ss`` is missing)."""
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed")
    wanted = set(pids)
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        address, _, port = fields[3].rpartition(":")
        for name, pid in _USERS.findall(line):
            if int(pid) in wanted:
                found.append(Listener(address, int(port), int(pid), name))
    return sorted(set(found))
