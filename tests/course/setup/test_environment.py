"""pyproject.toml (pip, the README's commands) and environment.yml (conda, cloud GPUs) pin the same packages."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from course_lib.paths import ROOT


def _normalise(requirement: str) -> tuple[str, str]:
    name, spec = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", requirement).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def _pyproject() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(_normalise(r) for r in data["project"]["dependencies"])


def _environment_yml() -> dict[str, str]:
    # A tiny reader for the one shape this file has: "  - pip:" followed by "      - requirement" lines.
    pip_lines, inside = [], False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if re.match(r"^\s*-\s*pip:\s*$", line):
            inside = True
            continue
        if inside:
            match = re.match(r"^\s{4,}-\s*(.+?)\s*$", line)
            if not match:
                break
            pip_lines.append(match.group(1))
    return dict(_normalise(r) for r in pip_lines if not r.startswith("-e"))


def test_both_lists_agree():
    assert _pyproject() == _environment_yml()


def test_torch_and_torchvision_are_pinned_exactly():
    pins = _pyproject()
    assert pins["torch"] == "==2.14.1"
    assert pins["torchvision"] == "==0.29.1"


def test_the_core_packages_are_there():
    assert {"torch", "torchvision", "jupyterlab", "ipywidgets", "matplotlib", "pytest"} <= set(_pyproject())


def test_the_installed_versions_are_the_pinned_ones():
    import torch
    import torchvision

    assert torch.__version__.split("+")[0] == "2.14.1"
    assert torchvision.__version__.split("+")[0] == "0.29.1"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 course.py test" in readme and "python3 course.py test" in ci
    assert "python3 course.py lab" in readme
