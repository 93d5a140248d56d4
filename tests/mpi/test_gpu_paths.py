"""The GPU engine function of ``bench gpu-node`` on one CPU ipyparallel MPI engine (the GPU-only
parts step aside). The pure GPU-path tests are in tests/unit/test_gpu_paths.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from chexnet_utils.bench import gpu_node
from chexnet_utils.bench.steptimer import StepConfig


@pytest.mark.mpi
def test_gpu_engine_function_runs_on_a_cpu_engine(tiny_tfrecords: Path) -> None:
    """The real runner and worker function, on one CPU engine: the GPU-only parts step aside
    (no device stage, both switches off) and the timing works."""
    run = gpu_node.cluster_runner(timeout=600)
    cfg = StepConfig(tfrecords=str(tiny_tfrecords), arch="small", image_size=32,
                     batch_size=8, warmup_steps=2, steps=3)
    res = run(1, cfg)
    assert (res["rank"], res["size"]) == (0, 1)
    assert res["mixed_precision"] is False and res["xla"] is False
    assert res["img_per_s"] == pytest.approx(3 * 8 / res["seconds"])
    assert res["window"][1] - res["window"][0] == pytest.approx(res["seconds"], abs=1e-3)
