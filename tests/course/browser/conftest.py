"""The browser tests' shared fixture (nothing they start is left running), and after them: seconds per notebook,
and where the screenshots are."""

from __future__ import annotations

import os
import time
from pathlib import Path

import browser_lab
import pytest


@pytest.fixture(scope="module", autouse=True)
def no_process_left_behind():
    """Set up first and torn down last in each module: after its servers and browsers are gone, nothing they started
    is left."""
    before = set(browser_lab.descendants(os.getpid()))
    yield
    deadline = time.monotonic() + 15
    while (left := set(browser_lab.descendants(os.getpid())) - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    details = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for pid in left
               if Path(f"/proc/{pid}/cmdline").exists()}
    assert not left, f"processes left running after the browser tests: {details}"


def pytest_terminal_summary(terminalreporter, config):
    runs = getattr(config, "course_browser_runs", None)
    if not runs:
        return
    terminalreporter.section("lessons in the browser")
    for name, run in runs.items():
        phases = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in run.phases.items())
        terminalreporter.write_line(f"{name}: {run.seconds:.1f} s ({phases})")
    total = sum(run.seconds for run in runs.values())
    terminalreporter.write_line(f"all {len(runs)} lessons: {total:.1f} s; screenshots: "
                                f"{next(iter(runs.values())).screenshot.parent}/")
