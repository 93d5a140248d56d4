"""The stopwatch shared by the input-pipeline benchmarks (chexnet_utils.platform.timing) and the
one engine StepConfig (chexnet_utils.bench.engine_steps): pure Python, no TensorFlow."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from chexnet_utils.bench.engine_steps import StepConfig
from chexnet_utils.platform.timing import (
    RunMean,
    Window,
    alternating,
    barrier_windows,
    batch_len,
    block,
    fed_run,
    first_batch,
    idle_fraction,
    mean_std,
    pipeline_run,
    ratio,
    timed_run,
)


class Arr:
    """A stand-in for a tensor: a shape, and a ``numpy()`` that counts its calls."""

    def __init__(self, n: int) -> None:
        self.shape = (n, 2)
        self.fetched = 0

    def numpy(self) -> int:
        self.fetched += 1
        return 0


def batches(*sizes: int) -> list[tuple[Arr, Arr]]:
    return [(Arr(n), Arr(n)) for n in sizes]


def test_batch_len_and_block() -> None:
    assert batch_len((Arr(5), Arr(5))) == 5
    assert batch_len(({"image": Arr(3)}, Arr(3))) == 3
    assert batch_len(Arr(7)) == 7
    a, b, c = Arr(1), Arr(1), Arr(1)
    block({"loss": a, "more": [b, (c, None)]})
    assert (a.fetched, b.fetched, c.fetched) == (1, 1, 1)
    block(None)
    block(3.0)  # a host value: nothing to wait for


def test_mean_std_and_run_mean() -> None:
    assert mean_std([]) == (0.0, 0.0)
    assert mean_std([4.0]) == (4.0, 0.0)
    assert mean_std([1.0, 3.0]) == pytest.approx((2.0, 2 ** 0.5))

    @dataclass
    class R:
        rates: list[float] = field(default_factory=list)
        mean = RunMean("rates", "the mean rate")

    assert R([2.0, 4.0, 9.0]).mean == pytest.approx(5.0)
    assert R().mean == 0.0
    assert R.mean.__doc__ == "the mean rate"
    assert asdict(R([1.0])) == {"rates": [1.0]}  # not a field


def test_ratio_and_idle_fraction_read_nan_when_not_measured() -> None:
    import math

    assert ratio(3.0, 2.0) == 1.5 and math.isnan(ratio(3.0, 0.0))
    assert idle_fraction(80.0, 200.0) == pytest.approx(0.6)
    assert idle_fraction(250.0, 200.0) == 0.0  # fed faster than the model alone: noise
    assert math.isnan(idle_fraction(80.0, 0.0))


def test_alternating_order() -> None:
    assert alternating(["a", "b"], 3) == ["a", "b", "b", "a", "a", "b"]
    assert alternating({"x": 1}, 2) == ["x", "x"]
    assert alternating(["a", "b"], 0) == []


def test_timed_run_counts_images_and_stops_at_the_end() -> None:
    it = iter(batches(4, 4, 3))
    images, seconds = timed_run(it, 2)
    assert images == 8 and seconds >= 0
    assert timed_run(it, 5)[0] == 3  # only the partial batch is left
    assert timed_run(it, 5)[0] == 0


def test_pipeline_run_skips_the_warm_up_on_a_fresh_iterator() -> None:
    data = batches(1, 2, 4, 8)
    assert pipeline_run(data, 2, 1)[0] == 2 + 4
    assert pipeline_run(data, 10, 0)[0] == 15  # fresh iterator each time
    assert pipeline_run(data, 1, 9)[0] == 0


def test_fed_run_calls_the_step_and_waits_for_its_result() -> None:
    data = batches(2, 3, 5, 7)
    seen: list[int] = []
    results: list[Arr] = []

    def step(batch: Any) -> Arr:
        seen.append(batch_len(batch))
        results.append(Arr(1))
        return results[-1]

    images, _ = fed_run(step, data, n_steps=2, warmup=1)
    assert images == 3 + 5  # the warm-up batch is not counted
    assert seen == [2, 3, 5]
    assert all(r.fetched == 1 for r in results)
    assert fed_run(step, data, n_steps=9, warmup=0)[0] == 17  # ran out: fewer images
    with pytest.raises(ValueError, match="old: the dataset ran out during the warm-up"):
        fed_run(step, data, n_steps=1, warmup=5, what="old: the dataset")


def test_first_batch() -> None:
    x, y, extra = Arr(2), Arr(2), Arr(2)
    assert first_batch([(x, y, extra)]) == (x, y)
    with pytest.raises(ValueError, match="new: the dataset is empty"):
        first_batch([], "new: the dataset")


def test_one_step_config_from_a_config_a_dict_or_nothing() -> None:
    c = StepConfig(arch="small", image_size=32, tfrecords="/data", pipeline="old",
                   rank_cpus=((0, 1), (2, 3)))
    assert StepConfig.of(c) == c
    assert StepConfig.of(asdict(c)) == c  # what an engine receives
    assert StepConfig.of(None) == StepConfig()
    assert StepConfig().tfrecords is None and StepConfig().shuffle_buffer is None
    # overrides that are None keep the value
    assert StepConfig.of(c, steps=3, seed=None) == StepConfig(**{**asdict(c), "steps": 3})
    # JSON round trips turn tuples into lists
    d = {**asdict(c), "rank_cpus": [[0, 1], [2, 3]]}
    assert StepConfig.of(d).rank_cpus == ((0, 1), (2, 3))
    with pytest.raises(TypeError):
        StepConfig.of({"no_such_field": 1})


def test_barrier_windows_warm_up_then_barrier_to_barrier() -> None:
    log: list[str] = []

    def step() -> int:
        log.append("step")
        return len(log)

    finished: list[Any] = []
    windows = barrier_windows(step, lambda: log.append("barrier"), steps=2, repeats=2,
                              warmup_steps=1, finish=finished.append)
    assert log == ["step"] + ["barrier", "step", "step", "barrier"] * 2
    assert finished == [4, 8]  # the last step's result of each window
    assert len(windows) == 2 and all(isinstance(w, Window) for w in windows)
    assert all(w.seconds >= 0 and w.start > 0 for w in windows)
    assert windows[0].start <= windows[1].start


def test_barrier_windows_without_closing_barrier() -> None:
    log: list[str] = []
    windows = barrier_windows(lambda: log.append("call"), lambda: log.append("barrier"),
                              repeats=3, warmup_steps=2, closing_barrier=False)
    assert log == ["call", "call"] + ["barrier", "call"] * 3
    assert len(windows) == 3
    assert barrier_windows(lambda: None, lambda: None, repeats=0) == []


def test_available_cores_is_the_one_implementation() -> None:
    from chexnet_utils.bench import benchmark
    from chexnet_utils.hardware import devices

    assert benchmark.available_cores is devices.usable_cores  # an alias, not a second copy
    assert devices.usable_cores() == len(devices.usable_cpus()) >= 1
