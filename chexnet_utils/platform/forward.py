"""A loopback TCP port forwarded to a Unix socket: the browser's way into a private lab.

``make lab`` runs JupyterLab and everything it starts in a network namespace of the learner's
own (:mod:`chexnet_utils.platform.exposure`), where the unauthenticated servers the notebooks
start (tf.data service, MultiWorkerMirroredStrategy, ``mpiexec``'s listener) are out of every
other account's and host's reach. JupyterLab listens there on a Unix socket (a file, which
crosses the namespace); :class:`UnixForwarder` listens on ``127.0.0.1`` in the host's
namespace and copies bytes both ways, so the browser opens ``http://127.0.0.1:8888/lab`` as
usual. What it forwards to is Jupyter's server, which asks every request for its token.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading


class UnixForwarder:
    """Forward ``host:port`` (TCP, ``port=0``: a free one) to the Unix socket ``path``, in a
    thread of this process until :meth:`stop`. :attr:`port` is the port listened on."""

    def __init__(self, path: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.path, self.host = path, host
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, name="unix-forwarder", daemon=True)

    def start(self) -> UnixForwarder:
        """Listen (raises ``OSError`` when the port is taken); returns ``self``."""
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        """Close the listening socket and every forwarded connection; wait for the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(
                self._connect, self.host, self.port, family=socket.AF_INET))
            self.port = self._server.sockets[0].getsockname()[1]
        except OSError as e:
            self._error = e
            self._started.set()
            return
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _connect(self, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        try:
            inner_reader, inner_writer = await asyncio.open_unix_connection(self.path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, inner_writer), _pipe(inner_reader, writer),
                             return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until end of file, then close ``writer``."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()
