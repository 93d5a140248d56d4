import numpy as np
import pytest

from chexnet_utils.data.labels import (
    NO_FINDING,
    PATHOLOGIES,
    LabelError,
    UnknownLabelError,
    labels_to_multihot,
    multihot_to_labels,
    parse_finding_labels,
)


def test_names_as_nih_spells_them():
    assert len(PATHOLOGIES) == 14
    assert "Pleural_Thickening" in PATHOLOGIES
    assert len(set(PATHOLOGIES)) == 14


def test_multihot_positions():
    v = labels_to_multihot("Cardiomegaly|Emphysema")
    assert v.dtype == np.float32 and v.shape == (14,)
    assert set(np.flatnonzero(v)) == {PATHOLOGIES.index("Cardiomegaly"),
                                      PATHOLOGIES.index("Emphysema")}


def test_no_finding_is_all_zero_and_round_trips():
    assert labels_to_multihot(NO_FINDING).sum() == 0
    assert multihot_to_labels(np.zeros(14)) == NO_FINDING


@pytest.mark.parametrize("text", ["Hernia", "Effusion|Atelectasis|Infiltration", *PATHOLOGIES])
def test_round_trip_every_label(text):
    back = multihot_to_labels(labels_to_multihot(text))
    assert set(back.split("|")) == set(text.split("|"))


def test_order_and_repeats_do_not_matter():
    assert parse_finding_labels(" Mass | Nodule|Mass") == ["Mass", "Nodule"]


def test_unknown_label_is_named():
    with pytest.raises(UnknownLabelError, match="Pneumonitis"):
        labels_to_multihot("Mass|Pneumonitis")


def test_no_finding_mixed_with_a_pathology_is_rejected():
    with pytest.raises(LabelError, match="combined with other labels"):
        labels_to_multihot("No Finding|Mass")


def test_threshold_and_length_checks():
    probs = np.full(14, 0.2)
    probs[PATHOLOGIES.index("Edema")] = 0.7
    assert multihot_to_labels(probs) == "Edema"
    with pytest.raises(ValueError):
        multihot_to_labels(np.zeros(13))


def test_nih_prevalence_is_one_table_from_the_counts():
    from chexnet_utils import plots
    from chexnet_utils.data import synthetic
    from chexnet_utils.data.labels import NIH_IMAGES, NIH_LABEL_COUNTS, NIH_PREVALENCE

    assert list(NIH_PREVALENCE) == [*PATHOLOGIES, NO_FINDING]
    for name, count in NIH_LABEL_COUNTS.items():
        assert NIH_PREVALENCE[name] == count / NIH_IMAGES
    assert round(NIH_PREVALENCE[NO_FINDING], 3) == 0.538
    assert round(NIH_PREVALENCE["Hernia"], 3) == 0.002
    # Multi-label: the label counts add up to more than the images.
    assert sum(NIH_LABEL_COUNTS.values()) > NIH_IMAGES
    # The figures and the synthetic sampler use this one table.
    assert plots.NIH_PREVALENCE is NIH_PREVALENCE
    assert synthetic.TARGET_PREVALENCE is NIH_PREVALENCE
