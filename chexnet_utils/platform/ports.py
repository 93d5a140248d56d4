"""Free TCP ports: the one place the package asks the OS for a port nothing listens on.

Binding to port 0 makes the kernel pick a free port; the socket is closed again and the
number handed to whoever listens next (a tf.data service, a MultiWorkerMirroredStrategy
worker, slurmctld/slurmd, JupyterLab). A small race remains: another process could take the
port in between; callers that start a daemon on it retry with new ports when it was taken
(:meth:`chexnet_utils.cluster.slurm_local.LocalSlurm.start`).
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now (all held open until every one is
    chosen, so the OS cannot hand out the same port twice)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = LOOPBACK) -> int:
    """One TCP port free on ``host`` right now (``127.0.0.1`` by default).

    Also run on every engine (``cluster.run(free_port)``) to build ``TF_CONFIG``: each engine
    picks a port on its own host.
    """
    return free_ports(1, host)[0]
