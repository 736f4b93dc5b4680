"""pyproject.toml (the supported range), constraints.txt (the exact torch of a fresh environment) and
environment.yml (conda, cloud GPUs) agree."""

from __future__ import annotations

import re
from pathlib import Path

from course_lib.paths import ROOT

from pyproject_toml import pyproject


def _normalise(requirement: str) -> tuple[str, str]:
    name, spec = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", requirement).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def _pyproject() -> dict[str, str]:
    return dict(_normalise(r) for r in pyproject()["project"]["dependencies"])


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


def _lock() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return dict(_normalise(line) for line in lines if line.strip() and not line.startswith("#"))


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.match(r"\d+(?:\.\d+)*", version).group(0).split("."))


def _in_range(version: str, spec: str) -> bool:
    low, high = re.fullmatch(r">=([0-9.]+),<([0-9.]+)", spec).groups()
    return _release(low) <= _release(version) < _release(high)


def test_environment_yml_is_pyproject_with_the_locked_torch():
    assert _environment_yml() == {**_pyproject(), **_lock()}


def test_the_lock_pins_torch_and_torchvision_exactly_inside_the_supported_range():
    lock, ranges = _lock(), _pyproject()
    assert set(lock) == {"torch", "torchvision"}
    for name, pin in lock.items():
        assert pin.startswith("==") and _in_range(pin[2:], ranges[name]), (name, pin, ranges[name])


def test_the_supported_range_starts_at_the_torch_seen_on_gpu_images():
    assert _in_range("2.11.0", _pyproject()["torch"])  # torch 2.11.0+cu130 on the lent H100 image


def test_the_core_packages_are_there():
    assert {"torch", "torchvision", "jupyterlab", "ipywidgets", "matplotlib", "pytest"} <= set(_pyproject())


def test_the_installed_versions_are_in_the_supported_range():
    import torch
    import torchvision

    ranges = _pyproject()
    assert _in_range(torch.__version__, ranges["torch"]), torch.__version__
    assert _in_range(torchvision.__version__, ranges["torchvision"]), torchvision.__version__


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 course.py test" in readme and "python3 course.py test" in ci
    assert "python3 course.py lab" in readme
