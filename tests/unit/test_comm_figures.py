"""The figures of notebooks 04 and 05 (``chexnet_utils.plots``), drawn from small made-up
results shaped like the real ones: axes, labels and the plotted values are checked."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from chexnet_utils import plots  # noqa: E402
from chexnet_utils.bench.scaling import ScalingBlock  # noqa: E402
from chexnet_utils.comm import costmodel  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_alpha_beta_fit_draws_measurements_and_the_model():
    sizes = [1e3, 1e5, 1e7]
    fit = (20e-6, 1e-9)
    times = [costmodel.predict("ring", 2, s, *fit) for s in sizes]
    fig = plots.alpha_beta_fit(sizes, {"ring": (times, fit, "ring", False),
                                       "PS": ([2 * t for t in times], fit, "ps", True)}, n=2)
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlabel() == "tensor size (bytes)" and ax.get_ylabel() == "time (ms)"
    assert "2 workers" in ax.get_title()
    lines = ax.get_lines()
    assert len(lines) == 4  # measured points + model line per series
    measured, model = lines[0], lines[1]
    np.testing.assert_allclose(measured.get_ydata(), np.asarray(times) * 1e3)
    # exact data: on the line
    np.testing.assert_allclose(model.get_ydata(), np.asarray(times) * 1e3)
    assert model.get_color() == measured.get_color()
    assert "alpha 20 us, 1/beta 1.00 GB/s" in _labels(ax)[1]


def test_scaling_prediction_matches_the_cost_model_and_marks_the_reports():
    grads = {"densenet121": 28e6, "resnet50": 94e6}
    fig = plots.scaling_prediction(grads, 0.1, 10e-6, 1e-9, overhead_s=1e-3,
                                   reported=costmodel.REPORTED_HOROVOD_2018)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "scaling efficiency" and ax.get_xscale() == "log"
    labels = _labels(ax)
    assert "DenseNet-121, ring (this link)" in labels and "ResNet-50, parameter server" in labels
    assert "ResNet-50, ring, 25 Gbit/s links" in labels
    assert sum("reported, Horovod paper" in t for t in labels) == 3
    ring = ax.get_lines()[labels.index("ResNet-50, ring (this link)")]
    expect = [costmodel.scaling_efficiency_prediction(int(n), 94e6, 0.1, 10e-6, 1e-9,
                                                      overhead_s=1e-3) for n in ring.get_xdata()]
    np.testing.assert_allclose(ring.get_ydata(), expect)
    assert list(ring.get_xdata()) == [2 ** k for k in range(1, 10)]


def test_fp16_compression_two_lines_in_ms():
    fig = plots.fp16_compression([1024, 4096], [1e-3, 2e-3], [1.5e-3, 1e-3], n=2)
    ax = fig.axes[0]
    a, b = ax.get_lines()
    assert list(a.get_ydata()) == [1.0, 2.0] and list(b.get_ydata()) == [1.5, 1.0]
    assert ax.get_title() == "fp16 compression, 2 workers"
    assert _labels(ax) == ["float32 (no compression)", "hvd.Compression.fp16"]


def _step(rate: float) -> dict:
    return {"img_per_s": rate, "runs_img_per_s": [rate - 1, rate, rate + 1]}


def test_backend_throughput_bars_and_run_ticks():
    steps = {"Horovod": [_step(100.0), _step(99.0)], "MWMS": [_step(80.0), _step(81.0)]}
    fig = plots.backend_throughput(steps, "images/s, 2 workers")
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == [100.0, 80.0]  # rank 0's median
    assert [t.get_text() for t in ax.get_yticklabels()] == ["Horovod", "MWMS"]
    ticks = ax.get_lines()
    assert [list(t.get_xdata()) for t in ticks] == [[99.0, 100.0, 101.0], [79.0, 80.0, 81.0]]
    assert ax.get_xlabel() == "images/s, 2 workers"
    assert ax.yaxis_inverted()  # first back end on top


def test_tensor_fusion_one_panel_per_burst():
    burst = {"min_s": 0.002, "times_s": [0.002, 0.003]}
    bursts = {"fusion on": {"big": burst, "small": burst},
              "fusion off": {"big": {**burst, "min_s": 0.004}, "small": burst}}
    fig = plots.tensor_fusion(bursts, {"big": [250_000, 250_000], "small": [1024] * 3}, n=2)
    left, right = fig.axes
    assert [p.get_width() for p in left.patches] == pytest.approx([2.0, 4.0])
    assert left.get_title() == "big: 2 allreduces, 2.0 MB"
    assert right.get_title().startswith("small: 3 allreduces")
    assert [t.get_text() for t in right.get_yticklabels()] == ["", ""]
    assert fig._suptitle.get_text() == "Tensor fusion, 2 workers"


def test_binding_vertical_bars():
    fig = plots.binding({"core": _step(50.0), "none": _step(40.0)}, n=2, cores=2)
    ax = fig.axes[0]
    assert [p.get_height() for p in ax.patches] == [50.0, 40.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["--bind-to core", "--bind-to none"]
    assert ax.get_title() == "Process binding, 2 workers on 2 cores"


def _trace(tmp_path, name: str) -> str:
    events = [{"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "ts": 0, "pid": 1, "tid": 1},
              {"ph": "E", "ts": 50, "pid": 1, "tid": 1},
              {"name": "ALLREDUCE", "ph": "B", "ts": 50, "pid": 1, "tid": 1},
              {"ph": "E", "ts": 90, "pid": 1, "tid": 1},
              {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad_0"}}]
    path = tmp_path / name
    path.write_text(json.dumps(events))
    return str(path)


def test_allreduce_overlap_one_timeline_per_mode(tmp_path):
    runs = {mode: {"timeline": _trace(tmp_path, f"{mode}.json"), "n_tensors": 1}
            for mode in ("per_tensor", "grouped")}
    fig = plots.allreduce_overlap(runs)
    assert [ax.get_title() for ax in fig.axes[:2]] == [
        "per_tensor: when each gradient reached Horovod",
        "grouped: when each gradient reached Horovod"]


def _block(rates_old: list[float], rates_new: list[float]) -> ScalingBlock:
    def per(rates: list[float]) -> dict[int, list[float]]:  # one run per worker count
        return {i + 1: [r] for i, r in enumerate(rates)}

    return ScalingBlock(runs={"old": per(rates_old), "new": per(rates_new)})


def test_scaling_panels_ideal_lines_and_efficiency_labels():
    cpu, accel = _block([10.0, 12.0], [10.0, 19.0]), _block([30.0, 15.0], [30.0, 60.0])
    fig = plots.scaling_panels({"model on the CPU": cpu, "emulated": accel}, [1, 2])
    left, right = fig.axes
    assert (left.get_title(), right.get_title()) == ("model on the CPU", "emulated")
    ideal, old, new = left.get_lines()
    assert list(ideal.get_ydata()) == [10.0, 20.0] and list(new.get_ydata()) == [10.0, 19.0]
    assert [t.get_text() for t in left.texts] == ["60%", "95%"]  # old, new at 2 workers
    assert [t.get_text() for t in right.texts] == ["25%", "100%"]
    assert left.get_xlabel() == "workers (one core each)"


def test_worker_learning_curves_loss_and_auroc():
    fig = plots.worker_learning_curves(
        {"1 worker": {"loss": [0.9, 0.7], "val_mean_auroc": [0.6, 0.7]},
         "2 workers": {"loss": [1.0, 0.8]}}, title="t")
    loss, auroc = fig.axes
    assert loss.get_ylabel() == "training loss (mean over workers)"
    assert [list(line.get_ydata()) for line in loss.get_lines()] == [[0.9, 0.7], [1.0, 0.8]]
    assert list(auroc.get_lines()[0].get_ydata()) == [0.6, 0.7]
    assert np.isnan(auroc.get_lines()[1].get_ydata()).all()  # no validation: no line
    assert _labels(loss) == ["1 worker", "2 workers"]
