"""The README's Python example runs as written (a newcomer copies it), and its two set-up commands are the ones CI uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.slow
def test_the_python_example_runs_as_written(monkeypatch):
    monkeypatch.chdir(README.parent)  # its paths are the repository's, as a newcomer runs it
    (code,) = _blocks("python")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    plan, model = scope["plan"], scope["model"]
    assert plan.solver.status == "optimal" and plan.meets_bounds
    lowered = {fqn for fqn, p in plan.to_fqn_config("t4").items() if p != "fp32"}
    assert lowered and all(type(dict(model.named_modules())[f]).__name__.startswith("Q") for f in lowered)


def test_exactly_two_setup_commands_one_installs_and_plans_one_runs_the_tests():
    bash = [b.strip() for b in _blocks("bash")]
    assert len(bash) == 2
    install, tests = bash
    assert "pip install torch==2.13.0" in install and "qsync-opt solve examples/" in install
    assert "pip install -e \".[dev]\"" in tests and tests.endswith("python -m pytest -q")


def test_the_readme_is_a_front_door_not_a_notebook():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    cells = [c.strip() for line in text.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    assert max(len(c) for c in cells) <= 300
    for section in ("## Training", "## Serving", "## Data loading", "## RL rollouts", "indicator in plain words"):
        assert section in text
