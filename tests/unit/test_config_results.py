import json

import pytest

from chexnet_utils import config
from chexnet_utils.notebook import results


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


def test_scale_fields_replace_the_notebooks_ci_branches():
    """The values notebooks 05 and 06 used to pick with ``SCALE.name == "ci"``: the same at
    ``ci`` (same CI run), the former non-ci values elsewhere."""
    ci, others = config.SCALES["ci"], [config.SCALES["workstation"], config.SCALES["gpu-node"]]
    assert (ci.comm_repeats, ci.comm_image_size, ci.comm_cycle_time_clusters, ci.feeding_shards) \
        == (5, 64, False, 3)
    for s in others:
        assert (s.comm_repeats, s.comm_image_size, s.comm_cycle_time_clusters, s.feeding_shards) \
            == (10, 128, True, 16)
    for s in config.SCALES.values():   # literals of notebooks 02, 05 and 06, now fields
        assert (s.comm_batch_size, s.comm_steps, s.comm_warmup_steps, s.comm_step_repeats) \
            == (16, 10, 3, 3)
        assert (s.bench_warmup, s.feeding_repeats, s.service_warmup) == (2, 1, 3)
    assert {n: s.comm_max_mb for n, s in config.SCALES.items()} == {
        "ci": 32, "workstation": 128, "gpu-node": 256}     # collectives' former table (MiB)


def test_comm_max_mb_override(monkeypatch):
    monkeypatch.setenv("CHEXNET_COMM_MAX_MB", "4")
    assert config.scale("gpu-node").comm_max_mb == 4.0
    monkeypatch.setenv("CHEXNET_COMM_MAX_MB", "0.5")
    assert config.scale("ci").comm_max_mb == 0.5
    for bad in ("0", "-1", "lots"):
        monkeypatch.setenv("CHEXNET_COMM_MAX_MB", bad)
        with pytest.raises(ValueError, match="CHEXNET_COMM_MAX_MB"):
            config.scale("ci")


def test_every_override_names_a_field_and_every_field_is_documented():
    import ast
    import dataclasses
    from pathlib import Path

    fields = {f.name for f in dataclasses.fields(config.Scale)}
    assert {field for field, _ in config.OVERRIDES.values()} <= fields
    source = Path(config.__file__).read_text(encoding="utf-8")
    cls = next(n for n in ast.parse(source).body
               if isinstance(n, ast.ClassDef) and n.name == "Scale")
    documented = {a.target.id for a, doc in zip(cls.body, cls.body[1:], strict=False)
                  if isinstance(a, ast.AnnAssign) and isinstance(doc, ast.Expr)
                  and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)}
    assert fields - documented == set(), "document each Scale field (which notebooks read it)"
    module_doc = ast.get_docstring(ast.parse(source))
    assert all(var in module_doc for var in config.OVERRIDES), "list every override variable"
    readme = (Path(config.__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert all(f"`{var}`" in readme for var in config.OVERRIDES), "README's settings table"


def test_every_presets_scaling_warmup_outlasts_the_old_pipelines_stock():
    """Notebook 04 times throughput, not stock: before the clock starts, each engine has
    taken more warm-up steps than the old pipeline holds decoded batches
    (``prefetch(batch_size)`` plus the shuffle buffer)."""
    import math

    from chexnet_utils.bench.scaling import SHUFFLE_BUFFER
    from chexnet_utils.config import SCALES

    for s in SCALES.values():
        stock = s.scaling_batch_size + math.ceil(SHUFFLE_BUFFER / s.scaling_batch_size)
        assert s.scaling_warmup_steps > stock, s.name


def test_bench_preset_compares_only_the_presets_overrides():
    """``make bench-preset`` (scripts/bench_preset.py) runs a notebook under two settings of
    the preset's environment overrides; anything else would not change what it times."""
    from tests.support.scripts import load_script

    bench = load_script("bench_preset")
    assert bench.parse_env(["CHEXNET_BENCH_BATCHES=5", "CHEXNET_FEEDING_BATCHES=8"]) == {
        "CHEXNET_BENCH_BATCHES": "5", "CHEXNET_FEEDING_BATCHES": "8"}
    with pytest.raises(SystemExit, match="not a preset override: \\['CHEXNET_BATCHES'\\]"):
        bench.parse_env(["CHEXNET_BATCHES=5"])
    assert bench.summary([2.0, 1.0, 4.0]) == "2 1 4  median 2, max/min 4.00"
    assert config.scale("ci").bench_batches == 5 and config.scale("ci").feeding_batches == 8
    assert config.scale("workstation").bench_batches == 8
