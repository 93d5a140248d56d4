"""The bounded interrupt of engine tasks (chexnet_utils.cluster.engine_interrupts), with a fake
client; the real engines are in tests/mpi/test_cluster.py and the browser session test."""

from __future__ import annotations

import signal
from collections import defaultdict

import pytest

from chexnet_utils.cluster.engine_interrupts import (
    is_sigint,
    pending_tasks,
    settle_on_sigint,
    wait_for_tasks,
)


class FakeClient:
    """What the module reads of an ``ipyparallel.Client``: ids, outstanding, the per-engine
    bookkeeping, ``wait`` and ``send_signal``."""

    def __init__(self, per_engine: dict[int, set[str]], finish_on_wait: bool = True,
                 wait_raises: BaseException | None = None) -> None:
        self.ids = sorted(per_engine)
        self._engines = {eid: f"uuid-{eid}" for eid in per_engine}
        self._outstanding_dict = defaultdict(set, {f"uuid-{e}": set(m)
                                                   for e, m in per_engine.items()})
        # the broadcast parent ids stay in `outstanding` for good (ipyparallel 9.2)
        self.outstanding = {"parent-1", *{m for ms in per_engine.values() for m in ms}}
        self.finish_on_wait, self.wait_raises = finish_on_wait, wait_raises
        self.waited: list[tuple[set[str], float]] = []
        self.signals: list[tuple[object, object]] = []

    def wait(self, jobs, timeout):  # noqa: ANN001, ANN201
        self.waited.append((set(jobs), timeout))
        if self.wait_raises is not None:
            raise self.wait_raises
        if self.finish_on_wait:
            for ms in self._outstanding_dict.values():
                ms.clear()
        return self.finish_on_wait

    def send_signal(self, sig, targets=None, block=None):  # noqa: ANN001, ANN201
        """Send a signal."""
        self.signals.append((sig, targets))
        return "reply"


@pytest.mark.parametrize("sig", [signal.SIGINT, 2, "SIGINT", "sigint", "INT"])
def test_sigint_in_every_form_send_signal_takes(sig):
    assert is_sigint(sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, 15, "SIGTERM", None, "x"])
def test_other_signals_are_not_sigint(sig):
    assert not is_sigint(sig)


def test_pending_tasks_are_per_engine_and_ignore_broadcast_parents():
    client = FakeClient({0: {"a_0"}, 1: set(), 2: {"a_2", "b_2"}})
    assert pending_tasks(client) == {0: {"a_0"}, 2: {"a_2", "b_2"}}
    assert pending_tasks(None) == {}
    assert pending_tasks(FakeClient({0: set(), 1: set()})) == {}  # parents only: idle


def test_without_the_bookkeeping_every_outstanding_task_counts_everywhere():
    class Plain:
        ids = [0, 1]
        outstanding = {"m"}

    assert pending_tasks(Plain()) == {0: {"m"}, 1: {"m"}}
    Plain.outstanding = set()
    assert pending_tasks(Plain()) == {}


def test_wait_for_tasks_waits_for_exactly_the_pending_ones():
    client = FakeClient({0: {"a_0"}, 1: {"a_1"}})
    settled = wait_for_tasks(client, timeout=3)
    assert client.waited == [({"a_0", "a_1"}, 3)]
    assert settled.done and settled.busy == [0, 1] and settled.still_busy == []
    idle = FakeClient({0: set()})
    assert wait_for_tasks(idle, 3).done and idle.waited == []


def test_a_task_that_does_not_end_is_reported_with_its_engine():
    settled = wait_for_tasks(FakeClient({0: set(), 1: {"a_1"}}, finish_on_wait=False), 1)
    assert not settled.done and settled.still_busy == [1] and not settled.interrupted_again


@pytest.mark.parametrize("raised, again", [(KeyboardInterrupt(), True),
                                           (RuntimeError("engine died"), False)])
def test_a_second_interrupt_or_a_client_error_ends_the_wait(raised, again):
    settled = wait_for_tasks(FakeClient({0: {"a_0"}}, wait_raises=raised), 10)
    assert not settled.done and settled.interrupted_again is again
    assert settled.still_busy == [0]


def test_settle_on_sigint_runs_after_a_sigint_only():
    client = FakeClient({0: set()})
    calls = []
    settle_on_sigint(client, lambda: calls.append("settled"))
    assert client.send_signal("SIGINT", targets=[0], block=True) == "reply"
    assert calls == ["settled"]
    client.send_signal(signal.SIGTERM, targets=[0])
    assert calls == ["settled"] and len(client.signals) == 2
    assert client.send_signal.__doc__ == "Send a signal."
