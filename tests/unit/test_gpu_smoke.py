"""``make gpu-smoke``'s pure pieces: no GPU -> exit 2 with one line; the verdicts it reads
from a notebook's checked cells; NCCL's version code both ways."""

from __future__ import annotations

import pytest

from chexnet_utils.hardware import devices
from chexnet_utils.notebook import gpu_smoke


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(devices, "visible_gpus", lambda env=None, physical=None: [])
    assert gpu_smoke.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "no NVIDIA GPU visible" in err and "CPU=1" in err


def test_checked_verdicts_are_the_true_false_lines_of_checked_cells() -> None:
    def cell(source: str, text: str) -> dict:
        return {"cell_type": "code", "source": source,
                "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}

    nb = {"cells": [cell("# NBVAL_CHECK_OUTPUT\nprint(...)", "a: True\nsteps: 2 2\nb: False\n"),
                    cell("print(...)", "not checked: False\n"),
                    {"cell_type": "markdown", "source": "True"}]}
    assert gpu_smoke.checked_verdicts(nb) == ["a: True", "b: False"]


def test_nccl_version_codes_before_and_after_2_9() -> None:
    assert gpu_smoke.nccl_version(0) == "-"
    assert gpu_smoke.nccl_version(2804) == "2.8.4"      # X*1000 + Y*100 + Z up to 2.8
    assert gpu_smoke.nccl_version(21903) == "2.19.3"    # X*10000 + Y*100 + Z from 2.9


def test_switch_words_read_the_describe_line() -> None:
    line = ("2 workers; mixed precision on (CHEXNET_MIXED_PRECISION=on), XLA off (off although "
            "CHEXNET_XLA=on: ...), device feed on (CHEXNET_DEVICE_FEED=on)")
    assert gpu_smoke.switch_words(line) == "mixed precision on, XLA off, device feed on"
