"""Figures moved out of notebook cells into ``chexnet_utils.plots`` (01, 06): they draw what
the notebooks drew."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from chexnet_utils import plots  # noqa: E402


def test_similarity_histogram_has_both_groups() -> None:
    same, different = np.array([0.9, 0.95, 0.8]), np.array([0.1, 0.3, 0.2, 0.4])
    fig = plots.similarity_histogram(same, different, bins=5)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["different patients",
                                                                   "same patient"]
    heights = [sum(p.get_height() for p in c) for c in ax.containers]
    assert heights == [len(different), len(same)]
    plt.close(fig)


def test_conversion_throughput_one_panel_per_size() -> None:
    from chexnet_utils.bench.conversion import ConversionRuns, ConversionThroughput

    bench = ConversionThroughput(
        cores=2, workers=[1, 2], repeats=1, shard_size=4, data_dir="d", n_images=8,
        runs={"original": ConversionRuns({1: [50.0], 2: [90.0]}),
              "320": ConversionRuns({1: [40.0], 2: [76.0]})})
    fig = plots.conversion_throughput(bench)
    assert len(fig.axes) == 2
    first, second = fig.axes
    assert [p.get_height() for p in first.patches] == [50.0, 90.0]
    assert [t.get_text() for t in second.get_xticklabels()] == ["1 worker(s)", "2 worker(s)"]
    assert first.get_title() == "original px: 1.80x" and second.get_title() == "320 px: 1.90x"
    plt.close(fig)
