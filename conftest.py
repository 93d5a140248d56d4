"""Repository-wide pytest hooks: the time tables at the end of ``make test``.

``make test`` runs in two stages (the Makefile's ``test`` target): the tests under ``tests/``
on parallel pytest-xdist workers (most of their time is spent waiting on subprocesses,
daemons, engines and browsers), then every notebook under nbval in one serial process, so no
other test runs beside a cell that times something (this conftest refuses notebooks under
xdist). ``--durations`` lists single cells; a table adds them up per notebook (kernel start
and stop included), so a slow notebook is visible at a glance; a second table splits every
layer's time into setup (fixtures), call and teardown and lists the slowest setups.

With ``CHEXNET_SAVE_EXECUTED`` set (``make test`` sets it to ``build/test/executed``), what
nbval executes is saved there as executed notebooks (:mod:`tests.support.executed_notebooks`),
which the course-site test at the end of the notebook stage builds its site from.

The two stages share their wall times through the file named by ``CHEXNET_TEST_TIMES``: the
tests stage writes its wall time there, the notebook stage reads it and prints the total
against the budget, 15 minutes on 2 cores (``CHEXNET_TEST_BUDGET_MIN`` to change it).
Each stage and each notebook also shows the share of the machine's CPUs that was busy
meanwhile (``/proc/stat``): a stage near 100 % is computing, so more parallel workers would
not shorten it; a notebook far below it waits (on engines, daemons, subprocesses).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

from chexnet_utils.platform.processes import command_lifetime
from tests.support.executed_notebooks import SAVE_ENV, ExecutedNotebooks
from tests.support.suite_times import (
    agenda_report,
    budget_minutes,
    busy_share,
    cpu_ticks,
    format_layer_times,
    format_wall_times,
    layer_of_test,
    notebook_of,
    read_stage_times,
    work_floor_note,
    write_stage_time,
)

TIMES_ENV = "CHEXNET_TEST_TIMES"

_notebook_seconds: dict[str, float] = defaultdict(float)
_other_seconds = [0.0]
_session_start = [time.monotonic()]
_phase_seconds: dict[tuple[str, str], float] = defaultdict(float)
_setup_seconds: dict[str, float] = {}
_session_ticks: list = [None]
_notebook_ticks: dict[str, list] = {}  # notebook -> [ticks at its first cell, after its last]
_cell_seconds: dict[str, dict[int, float]] = defaultdict(dict)  # notebook -> {code cell: s}
ROOT = Path(__file__).resolve().parent
_executed: list[ExecutedNotebooks] = []  # with CHEXNET_SAVE_EXECUTED: what nbval ran, saved


def _workers(config: pytest.Config) -> int:
    """pytest-xdist's worker count of this session (0: no xdist, one process): ``-n N``, or
    the ``--tx N*popen//...`` specs ``make test`` gives (each worker in a network namespace of
    its own)."""
    n = getattr(config.option, "numprocesses", None)
    if n:
        return int(n)
    specs = getattr(config.option, "tx", None) or []
    return sum(int(spec.split("*", 1)[0]) if "*" in spec.split("//", 1)[0] else 1
               for spec in specs)


def pytest_configure(config):  # noqa: ANN001, ANN201
    try:
        budget_minutes(os.environ)  # a bad CHEXNET_TEST_BUDGET_MIN: stop before the run
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    if (hasattr(config, "workerinput") or _workers(config)) and any(
            notebook_of(item.nodeid) for item in items):
        raise pytest.UsageError(
            "notebooks run alone, not on pytest-xdist workers: their cells time pipelines, "
            "training steps and allreduces, and a test running beside them would change the "
            "figures. Run them in a serial pytest (make test's second stage, or make notebooks).")


_lifetime: list = []


def pytest_sessionstart(session):  # noqa: ANN001, ANN201
    _session_start[0] = time.monotonic()
    _session_ticks[0] = cpu_ticks()
    # A lifeline for the whole session (each xdist worker gets its own too): everything a test
    # starts carries its token, and if pytest is killed (a CI timeout's SIGKILL) the watchdog
    # stops what is left: clusters, Slurm daemons, nbval's kernels (which leave through
    # ipykernel's parent poller, skipping every atexit). SIGTERM ends the run like Ctrl-C, with
    # the fixtures' teardowns.
    lifetime = command_lifetime()
    lifetime.__enter__()
    _lifetime.append(lifetime)
    if os.environ.get(SAVE_ENV) and not hasattr(session.config, "workerinput"):
        _executed.append(ExecutedNotebooks(Path(os.environ[SAVE_ENV])))


def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201
    # make test's notebook stage: keep each cell's outputs, write a notebook after its last
    # cell (the course site is built from those: tests/notebooks/test_course_site.py)
    for executed in _executed:
        if call.when == "call":
            executed.add(item)
        elif call.when == "teardown":
            executed.finish(item)


@pytest.hookimpl(trylast=True)  # after xdist has stopped its workers
def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001, ANN201
    while _lifetime:
        _lifetime.pop().__exit__(None, None, None)


def pytest_runtest_logstart(nodeid, location):  # noqa: ANN001, ANN201
    nb = notebook_of(nodeid)
    if nb is not None and nb not in _notebook_ticks:  # the notebook's first cell: its start
        _notebook_ticks[nb] = [cpu_ticks(), None]


def pytest_runtest_logfinish(nodeid, location):  # noqa: ANN001, ANN201
    nb = notebook_of(nodeid)
    if nb is not None and nb in _notebook_ticks:  # after each cell: the latest is its end
        _notebook_ticks[nb][1] = cpu_ticks()


def pytest_runtest_logreport(report):  # noqa: ANN001, ANN201
    _phase_seconds[(layer_of_test(report.nodeid), report.when)] += report.duration
    if report.when == "setup":
        _setup_seconds[report.nodeid] = report.duration
    nb = notebook_of(report.nodeid)
    if nb is None:
        _other_seconds[0] += report.duration
    else:
        _notebook_seconds[nb] += report.duration
        cell = report.nodeid.rpartition("::Cell ")[2]
        if report.when == "call" and cell.isdigit():
            _cell_seconds[nb][int(cell)] = report.duration


def pytest_terminal_summary(terminalreporter, config):  # noqa: ANN001, ANN201
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller prints the tables
    if _phase_seconds:
        terminalreporter.write_sep("=", "test time by layer")
        terminalreporter.write_line(format_layer_times(dict(_phase_seconds), _setup_seconds))
    elapsed = time.monotonic() - _session_start[0]  # collection and start-up included
    stage_busy = busy_share(_session_ticks[0], cpu_ticks())  # the whole machine's CPUs
    times_file = os.environ.get(TIMES_ENV)
    if not _notebook_seconds:
        if times_file and _phase_seconds:  # make test's first stage: hand on its wall time
            write_stage_time(times_file, "tests", elapsed, workers=_workers(config),
                             cpu_busy=stage_busy)
            busy_note = "" if stage_busy is None else f", CPUs {100 * stage_busy:.0f} % busy"
            terminalreporter.write_line(
                f"tests stage: {elapsed:.1f} s wall on {max(_workers(config), 1)} worker(s)"
                f"{busy_note} (written to {times_file} for the notebook stage's total)")
        return
    budget = budget_minutes(os.environ)
    earlier = read_stage_times(times_file) if times_file else {}
    other, label = _other_seconds[0], "other tests"
    busy = {nb: busy_share(*ticks) for nb, ticks in _notebook_ticks.items()}
    stages = {"notebook stage": (elapsed, stage_busy)}  # this stage alone, for the CPU work
    if "tests" in earlier:  # the tests ran before, in the first stage
        stage = earlier["tests"]
        other, label = other + stage["wall_s"], f"tests ({stage['workers'] or 1} workers)"
        elapsed += stage["wall_s"]
        busy[label] = stage.get("cpu_busy")
        stages["tests stage"] = (stage["wall_s"], busy[label])
    terminalreporter.write_sep("=", "notebook wall times")
    terminalreporter.write_line(format_wall_times(dict(_notebook_seconds), other, budget,
                                                  elapsed_seconds=elapsed, other_label=label,
                                                  cpu_busy=busy))
    if stage_busy is not None:
        terminalreporter.write_line(
            f"CPU use (busy share of the machine's {os.cpu_count()} CPUs over the stage; "
            f"every process on the machine counts): notebook stage {100 * stage_busy:.0f} %"
            + ("" if busy.get(label) is None else f", tests stage {100 * busy[label]:.0f} %")
            + ". Near 100 % a stage is computing, not waiting: more parallel workers would "
              "not make it faster.")
    floor_note = work_floor_note(stages, os.cpu_count() or 1, budget)
    if floor_note:
        terminalreporter.write_line(floor_note)
    if _cell_seconds:
        terminalreporter.write_sep("=", "the workshop agenda against this run")
        try:
            report = agenda_report(ROOT, dict(_cell_seconds))
        except Exception as e:  # a table must never fail the run it reports on
            report = f"agenda check failed: {type(e).__name__}: {e}"
        terminalreporter.write_line(report)
