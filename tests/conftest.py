"""Test options of the course: which folder is graded, points, GPU needs, and a JSON report.

    pytest --target exercises     grade the learner's files (the default)
    pytest --target solutions     grade the reference solutions (CI)
    pytest --target PATH          grade any folder of exNN_*.py files (the instructor's grader)
    pytest --course-report F      also write every test's outcome and points to F as JSON

Graded tests never import the graded files: they reach them through course_lib.runner,
in child processes, and get plain data back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    group = parser.getgroup("course")
    group.addoption("--target", default="exercises",
                    help="what to grade: 'exercises' (default), 'solutions', or a folder of exNN_*.py files")
    group.addoption("--course-report", default=None, help="write outcomes and points as JSON to this file")


def _target_folder(config) -> Path:
    target = config.getoption("--target")
    folder = ROOT / target if target in {"exercises", "solutions"} else Path(target).resolve()
    if not folder.is_dir():
        raise pytest.UsageError(f"--target {target}: no such folder ({folder})")
    return folder


def pytest_configure(config):
    folder = _target_folder(config)
    os.environ["COURSE_TARGET"] = str(folder)
    config.course_target = folder
    config.course_results = {}


@pytest.fixture
def target(request) -> Path:
    """The folder being graded."""
    return request.config.course_target


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    gpus = None
    config.course_collected = []
    for item in items:
        points = item.get_closest_marker("points")
        item.user_properties.append(("points", points.args[0] if points else None))
        config.course_collected.append({"nodeid": item.nodeid, "points": points.args[0] if points else None})
        needs = item.get_closest_marker("gpu")
        if needs:
            gpus = _gpu_count() if gpus is None else gpus
            wanted = needs.args[0] if needs.args else 1
            if gpus < wanted:
                reason = f"needs {wanted} CUDA GPU{'s' if wanted > 1 else ''}; this machine has {gpus}"
                item.add_marker(pytest.mark.skip(reason=reason))
                item.user_properties.append(("not_graded", reason))


def _short(report) -> str:
    if report.passed:
        return ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2].removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    for prefix in ("course_lib.runner.ExerciseFailed: ", "AssertionError: "):
        text = text.removeprefix(prefix)
    return text.strip()


def pytest_runtest_logreport(report):
    if _config is None:
        return
    results = _config.course_results
    entry = results.get(report.nodeid)
    if entry is None:  # the setup phase: passed, skipped or failed
        properties = dict(report.user_properties)
        results[report.nodeid] = {
            "nodeid": report.nodeid,
            "file": report.nodeid.split("::")[0],
            "points": properties.get("points"),
            "outcome": report.outcome,
            "message": _short(report),
            "not_graded": properties.get("not_graded"),
            "duration": round(report.duration, 3),
        }
    elif report.when == "call" or (report.failed and entry["outcome"] != "failed"):
        entry.update(outcome=report.outcome, message=_short(report))
        entry["duration"] = round(entry["duration"] + report.duration, 3)


_config = None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    global _config
    _config = session.config


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--course-report")
    if not path:
        return
    report = {
        "target": str(session.config.course_target),
        "exitstatus": int(exitstatus),
        "collected": getattr(session.config, "course_collected", []),
        "tests": list(session.config.course_results.values()),
    }
    Path(path).write_text(json.dumps(report, indent=1))
