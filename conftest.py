"""Repository-wide pytest hooks: a per-notebook wall-time table at the end of ``make test``.

``--durations`` lists single cells; the table adds them up per notebook (kernel start and
stop included), so a slow notebook is visible at a glance; a second table splits every layer's
time into setup (fixtures), call and teardown and lists the slowest setups. The CI budget for the whole suite
is 20 minutes on 2 cores (``CHEXNET_TEST_BUDGET_MIN`` to change it).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import pytest

from chexnet_utils.nbtools import (budget_minutes, format_layer_times, format_wall_times,
                                   layer_of_test, notebook_of)

_notebook_seconds: dict[str, float] = defaultdict(float)
_other_seconds = [0.0]
_session_start = [time.monotonic()]
_phase_seconds: dict[tuple[str, str], float] = defaultdict(float)
_setup_seconds: dict[str, float] = {}


def pytest_configure(config):  # noqa: ANN001, ANN201
    try:
        budget_minutes(os.environ)  # a bad CHEXNET_TEST_BUDGET_MIN: stop before the run
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_sessionstart(session):  # noqa: ANN001, ANN201
    _session_start[0] = time.monotonic()


def pytest_runtest_logreport(report):  # noqa: ANN001, ANN201
    _phase_seconds[(layer_of_test(report.nodeid), report.when)] += report.duration
    if report.when == "setup":
        _setup_seconds[report.nodeid] = report.duration
    nb = notebook_of(report.nodeid)
    if nb is None:
        _other_seconds[0] += report.duration
    else:
        _notebook_seconds[nb] += report.duration


def pytest_terminal_summary(terminalreporter):  # noqa: ANN001, ANN201
    if _phase_seconds:
        terminalreporter.write_sep("=", "test time by layer")
        terminalreporter.write_line(format_layer_times(dict(_phase_seconds), _setup_seconds))
    if not _notebook_seconds:
        return
    budget = budget_minutes(os.environ)
    terminalreporter.write_sep("=", "notebook wall times")
    elapsed = time.monotonic() - _session_start[0]  # collection and start-up included
    terminalreporter.write_line(format_wall_times(dict(_notebook_seconds), _other_seconds[0],
                                                  budget, elapsed_seconds=elapsed))
