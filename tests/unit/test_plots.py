import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from chexnet_utils import plots  # noqa: E402
from chexnet_utils.data.labels import PATHOLOGIES  # noqa: E402
from tests.support.datasets import multihot_matrix  # noqa: E402


def test_cooccurrence_counts_pairs():
    m = multihot_matrix(["Mass|Nodule", "Mass", "No Finding", "Nodule|Mass|Hernia"])
    c = plots.cooccurrence_matrix(m)
    mass, nodule, hernia = (PATHOLOGIES.index(n) for n in ("Mass", "Nodule", "Hernia"))
    assert c[mass, mass] == 3 and c[mass, nodule] == 2 and c[nodule, hernia] == 1
    assert (c == c.T).all()


def test_figures_draw(tmp_path):
    prev = {k: v / 2 for k, v in plots.NIH_PREVALENCE.items()}
    figs = [
        plots.label_distribution(prev),
        plots.cooccurrence(multihot_matrix(["Mass|Nodule", "Effusion"])),
        plots.image_grid([np.zeros((8, 8), np.uint8)] * 3, ["a", "b|c", "d"], cols=2),
        plots.bars({"old": 10.0, "new": 20.0}, "img/s", "t", errors={"old": 1, "new": 2},
                   reference=25, reference_label="ceiling"),
    ]
    for i, fig in enumerate(figs):
        fig.savefig(tmp_path / f"{i}.png")
        assert (tmp_path / f"{i}.png").stat().st_size > 1000
    ax = figs[0].axes[0]
    assert ax.get_xscale() == "log"
    assert len(ax.get_yticklabels()) == len(prev)


def test_pipeline_figures_draw(tmp_path):
    from chexnet_utils.bench.benchmark import Timeline

    seq = Timeline([0.0, 0.3], [0.2, 0.5], [0.3, 0.6], label="sequential")
    pipe = Timeline([0.0, 0.1], [0.0, 0.1], [0.1, 0.2], label="pipelined")
    fig = plots.timelines([seq, pipe], title="sum vs max")
    ax = fig.axes[0]
    by_height = dict(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels()),
                         strict=True))
    top, bottom = by_height[max(by_height)], by_height[min(by_height)]
    assert top == "sequential\nwaiting 67%" and bottom == "pipelined\nwaiting 0%"
    figs = [
        fig,
        plots.scaling([1, 2, 4], {"old": [100, 101, 99], "new": [200, 390, 800]}, "img/s",
                      "scaling", ideal="new", cap=400, cap_label="one machine"),
        plots.grouped_bars({"old": {"a": 1.0, "b": 2.0}, "new": {"a": 3.0, "b": 4.0}},
                           "img/s", "grouped", reference=5, reference_label="model"),
    ]
    for i, f in enumerate(figs):
        f.savefig(tmp_path / f"p{i}.png")
        assert (tmp_path / f"p{i}.png").stat().st_size > 1000
    lines = figs[1].axes[0].get_lines()
    ideal = [ln for ln in lines if ln.get_label() == "linear scaling"][0]
    assert list(ideal.get_ydata()) == [200, 400, 800]
    assert len(figs[2].axes[0].patches) == 4
    assert [ln.get_label() for ln in figs[2].axes[0].get_lines()] == ["model"]


def test_training_figures_draw(tmp_path):
    history = {"loss": [0.07, 0.05, 0.04], "val_loss": [0.08, 0.06, 0.065],
               "mean_auroc": [0.55, 0.75, 0.8], "val_mean_auroc": [0.7, 0.85, 0.88],
               "learning_rate": [1e-3, 1e-3, 1e-4]}
    curves = plots.learning_curves(history, reference=0.841, reference_label="paper")
    ax_loss, ax_auc = curves.axes
    assert [ln.get_label() for ln in ax_loss.get_lines()][:2] == ["training", "validation"]
    assert any(ln.get_label() == "paper" for ln in ax_auc.get_lines())
    # the learning-rate drop before epoch 3 is marked
    assert any(list(ln.get_xdata()) == [3, 3] for ln in ax_loss.get_lines())

    rng = np.random.default_rng(0)
    y = (rng.random((50, len(PATHOLOGIES))) < 0.3).astype(float)
    y[:, -1] = 0.0  # Hernia: no positives
    s = rng.random(y.shape) + 0.5 * y
    from chexnet_utils.model.auroc import CHEXNET_PAPER_AUROC

    roc = plots.roc_curves(y, s, reference=CHEXNET_PAPER_AUROC)
    titles = [ax.get_title() for ax in roc.axes]
    assert titles[0].startswith("Atelectasis\nAUROC 0.") and "paper 0.81" in titles[0]
    assert titles[len(PATHOLOGIES) - 1] == "Hernia\nAUROC n/a | paper 0.92"
    try:
        plots.roc_curves(y[:, :3], s[:, :3])
    except ValueError:
        pass
    else:
        raise AssertionError("3 columns with 14 names must be refused")

    image = rng.normal(size=(32, 32, 3))
    heat = np.zeros((32, 32))
    heat[4:10, 20:28] = 1.0
    overlay = plots.grad_cam_overlay(image, {"Mass": heat, "Nodule": heat * 0.5}, title="x")
    assert [ax.get_title() for ax in overlay.axes[:3]] == ["input", "Mass", "Nodule"]
    for i, fig in enumerate((curves, roc, overlay)):
        fig.savefig(tmp_path / f"t{i}.png")
        assert (tmp_path / f"t{i}.png").stat().st_size > 1000
