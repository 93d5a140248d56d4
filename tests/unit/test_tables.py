"""The one table helper notebooks use."""

import pytest

from chexnet_utils.tables import markdown_table, table


def test_mapping_rows_numbers_right_aligned_and_formatted():
    text = markdown_table([{"pipeline": "old", "img/s": 61.234}, {"pipeline": "new", "img/s": 124.9}])
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
