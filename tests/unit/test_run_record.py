"""Where a notebook ran, as its executed copy records it and the course site says it (#49)."""

from __future__ import annotations

from types import SimpleNamespace

from chexnet_utils.notebook.run_record import (
    describe_run,
    describe_runs,
    recorded_run,
    run_record,
    stamp,
)


def record(date: str, by: str = "make tutorial", gpus: tuple[str, ...] = ()) -> dict:
    return {"by": by, "date": date, "cores": 2, "cpu": "AMD EPYC", "gpus": list(gpus),
            "scale": "ci", "python": "3.11.7"}


def test_a_record_names_cores_cpu_gpus_scale_date_and_command():
    r = run_record("make test (nbval)")
    assert r["by"] == "make test (nbval)" and r["cores"] >= 1 and r["scale"] == "ci"
    assert r["date"].endswith(" UTC") and isinstance(r["gpus"], list)
    text = describe_run(record("2026-12-07 16:45 UTC", gpus=("A100", "A100")))
    assert text.startswith("**2 CPU cores** (AMD EPYC), 2 GPU(s): A100, A100, scale preset")
    assert "2026-12-07 16:45 UTC, by `make tutorial`" in text
    assert "**no GPU**" in describe_run(record("d"))
    assert "no record" in describe_run(None)


def test_stamp_writes_the_record_into_the_notebook_metadata():
    nb = SimpleNamespace(metadata={})
    assert recorded_run(nb) is None
    stamp(nb, record("d"))
    assert recorded_run(nb) == record("d")


def test_runs_of_one_machine_and_command_are_one_line_with_a_date_range():
    lines = describe_runs([record("2026-12-07 16:45 UTC"), record("2026-12-07 17:02 UTC"),
                           record("2026-12-07 17:10 UTC", by="make test (nbval)"), None])
    assert len(lines) == 3
    assert "2026-12-07 16:45 UTC to 2026-12-07 17:02 UTC, by `make tutorial`" in lines[0]
    assert "2026-12-07 17:10 UTC, by `make test (nbval)`" in lines[1]
    assert "no record" in lines[2]


def test_the_notebook_stage_starts_from_an_empty_folder_of_executed_notebooks(tmp_path):
    from tests.support.executed_notebooks import ExecutedNotebooks

    (tmp_path / "03_old.ipynb").write_text("{}")   # an earlier run's: never mixed with this one
    (tmp_path / "notes.txt").write_text("kept")
    recorder = ExecutedNotebooks(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert recorder.written == []
