"""The GitHub Pages workflow a fork runs to publish the course site (README, "The course as a
site"): this repository never runs it, so its shape is checked here."""

from __future__ import annotations

from pathlib import Path

import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "book.yml"


def test_the_pages_workflow_runs_the_course_then_builds_and_deploys_the_site():
    flow = yaml.safe_load(WORKFLOW.read_text())
    assert set(flow[True]) == {"workflow_dispatch"}   # YAML 1.1 reads `on:` as True: by hand only
    assert flow["permissions"] == {"contents": "read"}   # the deploy job alone may publish
    steps = flow["jobs"]["build"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert runs.index("make tutorial") < next(i for i, r in enumerate(runs)
                                              if r.startswith("make book"))
    upload = next(s for s in steps
                  if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "build/book"
    deploy = flow["jobs"]["deploy"]
    assert deploy["needs"] == "build"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["steps"][0]["uses"].startswith("actions/deploy-pages@")
