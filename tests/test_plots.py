import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from chexnet_utils import plots  # noqa: E402
from chexnet_utils.labels import PATHOLOGIES, multihot_matrix  # noqa: E402


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
