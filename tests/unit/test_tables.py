"""The one table helper notebooks use."""

import pytest

from chexnet_utils.notebook.tables import table
from chexnet_utils.platform.markdown import markdown_table


def test_mapping_rows_numbers_right_aligned_and_formatted():
    text = markdown_table([{"pipeline": "old", "img/s": 61.234},
                           {"pipeline": "new", "img/s": 124.9}])
    lines = text.splitlines()
    assert lines[0] == "| pipeline | img/s |"
    assert lines[1] == "|:---|---:|"
    assert lines[2] == "| old | 61.2 |" and lines[3] == "| new | 125 |"


def test_sequence_rows_need_columns_and_matching_length():
    with pytest.raises(ValueError, match="columns are required"):
        markdown_table([["a", 1]])
    with pytest.raises(ValueError, match="row 1 has 1 cells"):
        markdown_table([["a", 1], ["b"]], columns=["x", "y"])


def test_cells_escaped_none_empty_per_column_format_and_caption():
    text = markdown_table([("a|b", None, 0.5)], columns=["k", "v", "p"], floatfmt={"p": ".0%"})
    assert text.splitlines()[2] == "| a\\|b |  | 50% |"
    assert table([{"x": 1}], caption="Table 1").data.startswith("Table 1\n\n| x |")


def test_star_is_the_default_of_a_per_column_mapping():
    text = markdown_table([{"x": 1.234, "y": 0.5, "z": 12.0}], floatfmt={"*": ".1f", "y": ".0%"})
    assert text.splitlines()[2] == "| 1.2 | 50% | 12.0 |"
    # without "*" the other columns keep the module default (.3g)
    assert markdown_table([{"x": 1.234, "y": 0.5}], floatfmt={"y": ".0%"}).splitlines()[2] \
        == "| 1.23 | 50% |"


def test_integers_have_their_own_format_and_floats_theirs():
    text = markdown_table([{"n": 7051854, "mb": 27.94, "k": 3}], floatfmt=".1f",
                          intfmt={"n": ","})
    assert text.splitlines()[2] == "| 7,051,854 | 27.9 | 3 |"
    assert markdown_table([{"rate": 14270.94}], floatfmt=",.0f").splitlines()[2] == "| 14,271 |"


def test_numpy_scalars_are_numbers_and_numpy_bools_are_yes_no():
    np = pytest.importorskip("numpy")
    text = markdown_table([{"a": np.float32(0.25), "b": np.int64(5), "c": np.bool_(True)}],
                          floatfmt=".2f")
    lines = text.splitlines()
    assert lines[1] == "|---:|---:|:---|"
    assert lines[2] == "| 0.25 | 5 | yes |"


def test_empty_cells_keep_a_column_numeric_and_bad_alignment_is_an_error():
    text = markdown_table([{"k": "a", "v": 1.5}, {"k": "b", "v": None}], floatfmt=".1f")
    assert text.splitlines()[1:] == ["|:---|---:|", "| a | 1.5 |", "| b |  |"]
    with pytest.raises(ValueError, match="align must be one of"):
        markdown_table([{"k": "a"}], align={"k": "middle"})


def test_table_passes_intfmt_through():
    assert table([{"n": 1000}], intfmt=",").data.endswith("| 1,000 |")
