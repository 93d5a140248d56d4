import json

import pytest

from chexnet_utils import config, results


def test_scale_presets_and_env(monkeypatch):
    monkeypatch.delenv("CHEXNET_SCALE", raising=False)
    assert config.scale().name == "ci"
    monkeypatch.setenv("CHEXNET_SCALE", "Workstation")
    assert config.scale().name == "workstation"
    monkeypatch.setenv("CHEXNET_SCALE", "huge")
    with pytest.raises(ValueError, match="CHEXNET_SCALE='huge'"):
        config.scale()


def test_data_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("CHEXNET_DATA_DIR", raising=False)
    assert config.data_dir(config.scale("ci")).name == "synthetic-ci"
    assert not config.using_real_data()
    monkeypatch.setenv("CHEXNET_DATA_DIR", str(tmp_path))
    assert config.data_dir() == tmp_path.resolve() and config.using_real_data()


def test_record_merges_and_table(monkeypatch, tmp_path):
    monkeypatch.setenv("CHEXNET_WORK_DIR", str(tmp_path))
    results.record("02_pipeline", {"new_over_old": 2.5})
    results.record("02_pipeline", {"idle": 0.01})
    results.record("00_env", {"tensorflow": "2.18.1"})
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["02_pipeline"] == {"new_over_old": 2.5, "idle": 0.01}
    table = results.format_table(data)
    assert "new_over_old" in table and "2.5" in table and "2.18.1" in table
    assert table.splitlines()[0].split() == ["notebook", "figure", "value"]
