"""What the notebook's Interrupt does to tasks running on ipyparallel engines, made bounded.

JupyterLab's stop button (Kernel > Interrupt) sends SIGINT to the kernel's process group.
The controller, ``mpiexec`` and the engines are not in that group (ipyparallel starts its
launchers with ``start_new_session=True``, ipyparallel 9.2 ``cluster/launcher.py``), so only
the kernel's own wait is interrupted. What happens to the engines' task then depends on the
call that was waiting:

* ``%%px``: the magic catches the ``KeyboardInterrupt``, sends SIGINT to the engines
  (``Client.send_signal``) and returns at once, printing "Received Keyboard Interrupt.
  Sending signal SIGINT to engines..." (``client/magics.py``, ``parallel_execute``). The
  engines' ``KeyboardInterrupt`` arrives a moment later, and an engine (an ipykernel) that
  ends a request with an error *aborts* the requests already queued behind it
  (ipykernel 7 ``kernelbase.py``, ``_abort_queues``): the learner's next ``%%px`` cell,
  sent in that moment, comes back ``TaskAborted`` and prints nothing, silently.
* ``view.apply_sync(f)`` / ``view.execute(code, block=True)``: the ``KeyboardInterrupt`` is
  swallowed and the ``AsyncResult`` returned as if the call had been asynchronous
  (``DirectView._really_apply`` and ``BroadcastView._really_apply``: ``except
  KeyboardInterrupt: pass``); the engines go on.
* ``AsyncResult.get()`` / ``wait_interactive()``: the wait ends; the engines go on running.
  In both cases ``MPICluster.interrupt()`` stops them.

:func:`settle_on_sigint` makes every SIGINT sent through a client wait until the tasks it
interrupted have ended (:func:`wait_for_tasks`, bounded), so the next cell finds the engines
idle; :class:`~chexnet_utils.cluster.distributed.MPICluster` uses it and stops the cluster when an
engine stays busy (a call that ignores SIGINT, such as an MPI collective waiting for a rank
that was interrupted: that MPI job cannot go on).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Settled", "is_sigint", "pending_tasks", "settle_on_sigint", "wait_for_tasks"]


def is_sigint(sig: object) -> bool:
    """True for SIGINT given as a number, a ``signal.Signals`` or a name (``"SIGINT"``), the
    forms ``Client.send_signal`` accepts."""
    if isinstance(sig, str):
        return sig.upper() in ("SIGINT", "INT")
    try:
        return int(sig) == signal.SIGINT  # type: ignore[call-overload]  # any object: TypeError caught
    except (TypeError, ValueError):
        return False


def pending_tasks(client: Any) -> dict[int, set[str]]:
    """Engine id -> ids of ``client``'s tasks on that engine that have not finished.

    From the client's per-engine bookkeeping (``Client._engines``: id -> uuid, and
    ``Client._outstanding_dict``: uuid -> message ids; ipyparallel 9.2 ``client/client.py``
    and ``BroadcastView._make_async_result``). ``Client.outstanding`` alone will not do: it
    keeps the parent id of every broadcast (``%%px``, ``apply_sync``) for good. Without that
    bookkeeping (another ipyparallel), every outstanding id counts for every engine.
    """
    if client is None:
        return {}
    engines = getattr(client, "_engines", None)
    per_engine = getattr(client, "_outstanding_dict", None)
    if engines is None or per_engine is None:
        outstanding = set(client.outstanding)
        return {int(e): outstanding for e in client.ids} if outstanding else {}
    return {int(eid): set(per_engine[uuid]) for eid, uuid in list(engines.items())
            if per_engine.get(uuid)}


@dataclass
class Settled:
    """What became of the tasks that were running when SIGINT was sent."""

    busy: list[int] = field(default_factory=list)
    """Engines that had a task then."""
    done: bool = True
    """Every one of those tasks ended within the time allowed."""
    seconds: float = 0.0
    """How long the wait took."""
    interrupted_again: bool = False
    """A second ``KeyboardInterrupt`` ended the wait (the learner pressed the button again)."""
    still_busy: list[int] = field(default_factory=list)
    """Engines whose task had not ended when the wait ended."""


def wait_for_tasks(client: Any, timeout: float) -> Settled:
    """Wait up to ``timeout`` s until the tasks :func:`pending_tasks` lists now have ended.

    A ``KeyboardInterrupt`` during the wait ends it (``interrupted_again``); so does an error
    of the client (an engine died: its task will not end). Never raises."""
    tasks = pending_tasks(client)
    result = Settled(busy=sorted(tasks))
    pending = set().union(*tasks.values()) if tasks else set()
    t0 = time.monotonic()
    try:
        result.done = bool(client.wait(pending, timeout=timeout)) if pending else True
    except KeyboardInterrupt:
        result.done, result.interrupted_again = False, True
    except Exception:
        result.done = False
    result.seconds = time.monotonic() - t0
    if not result.done:
        result.still_busy = sorted(pending_tasks(client)) or result.busy
    return result


def settle_on_sigint(client: Any, after: Callable[[], None]) -> None:
    """Make ``client.send_signal`` call ``after()`` once a SIGINT has been sent (for
    ``%%px``, which calls it on an interrupt; other signals pass unchanged).

    Replaces the method on this one client object (``Cluster.connect_client`` builds the
    client, so no subclass can be slipped in)."""
    send_signal = client.send_signal

    def send_signal_and_settle(sig, targets=None, block=None):  # noqa: ANN001, ANN202
        reply = send_signal(sig, targets=targets, block=block)
        if is_sigint(sig):
            after()
        return reply

    send_signal_and_settle.__doc__ = send_signal.__doc__
    client.send_signal = send_signal_and_settle
