"""A packet capture in a few lines: every frame that crosses one network interface, as bytes.

Used to check what travels between the notebook's controller and engines on another host:
with CurveZMQ on, a marker string sent to an engine must not appear on the wire; with it off,
it does (the control that proves the capture sees the traffic). It needs root (a raw
``AF_PACKET`` socket, Linux only) and no extra package: ``tcpdump`` would do the same.

    with PacketCapture("veth0") as cap:
        view.apply_sync(echo, "MARKER-1234")
    cap.contains(b"MARKER-1234")       # False with encryption on

The capture runs in a background thread until the ``with`` block ends; it keeps at most
``limit`` bytes (older frames are not dropped, newer ones are: ``truncated`` says so).
"""

from __future__ import annotations

import socket
import threading

ETH_P_ALL = 0x0003
"""Every protocol (``<linux/if_ether.h>``)."""


class PacketCapture:
    """Frames seen on ``interface`` (both directions) while the context is open."""

    def __init__(self, interface: str, limit: int = 64 << 20) -> None:
        if not hasattr(socket, "AF_PACKET"):
            raise OSError("packet capture needs Linux (AF_PACKET sockets)")
        self.interface, self.limit = interface, limit
        self.data = bytearray()
        self.frames = 0
        self.truncated = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    def __enter__(self) -> PacketCapture:
        try:
            self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW,
                                       socket.htons(ETH_P_ALL))
        except PermissionError:
            raise PermissionError("packet capture needs root (CAP_NET_RAW)") from None
        self._sock.bind((self.interface, 0))
        self._sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._run, name=f"capture-{self.interface}",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        assert self._sock is not None
        while True:
            try:
                frame = self._sock.recv(65535)
            except socket.timeout:  # the queue is empty: done once asked to stop
                if self._stop.is_set():
                    break
                continue
            except OSError:
                break
            self.frames += 1
            if len(self.data) + len(frame) > self.limit:
                self.truncated = True
                continue
            self.data.extend(frame)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # the thread drains what is queued, then ends
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()

    def contains(self, marker: bytes | str) -> bool:
        """Whether ``marker`` appears anywhere in the captured frames."""
        needle = marker.encode() if isinstance(marker, str) else marker
        return needle in self.data
