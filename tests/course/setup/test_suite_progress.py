"""`python3 course.py test`'s progress line (course_lib/instructor/suite_progress.py): how many tests, then at
least every INTERVAL seconds how many are done, how many failed and the time left, with and without xdist."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from course_lib.instructor.suite_progress import SuiteProgress
from course_lib.paths import ROOT

SLOW_SUITE = '''
import time
import pytest

@pytest.mark.parametrize("n", range(4))
def test_slow(n):
    time.sleep(0.8)
    assert n != 2, "the one failure"
'''

LINE = re.compile(r"\[course\] (\d+) of 4 tests done, (\d+) failed, .* so far, "
                  r"(about .* left|finishing|time left not known yet)")


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "test_slow.py").write_text(SLOW_SUITE)
    history = tmp_path / "durations.json"
    env = {**os.environ, "COURSE_PROGRESS_INTERVAL": "0.5", "COURSE_PROGRESS_HISTORY": str(history)}
    # -c /dev/null: not the course's pyproject (its plugin wants a --target); rootdir: the temporary folder
    done = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-c", os.devnull, "--rootdir",
                           str(tmp_path), "-p", "course_lib.instructor.suite_progress", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return done, history


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one process", "two xdist workers"])
def test_the_long_step_says_how_far_it_is_and_remembers_the_durations(tmp_path, xdist):
    done, history = _run(tmp_path, *(xdist or ["-p", "no:xdist"]))
    out = done.stdout
    assert done.returncode == 1 and "1 failed, 3 passed" in out, out + done.stderr
    assert re.search(r"\[course\] 4 tests(, in 2 pytest workers)?; a progress line at least every 0.5 s", out), out
    lines = LINE.findall(out)
    # 3.2 s of tests (1.6 s with two workers, after they start) and a line at least every 0.5 s: several lines
    assert len(lines) >= 2, out
    counts = [(int(done_), int(failed)) for done_, failed, _ in lines]
    assert counts == sorted(counts) and all(f <= d for d, f in counts), counts  # they only grow
    assert any(0 < d < 4 for d, _ in counts), f"no line while the tests ran: {counts}"
    assert all(line.startswith("[course]") or "[course]" not in line for line in out.splitlines()), (
        "a progress line must start a line of its own, never follow pytest's dots:\n" + out)
    durations = json.loads(history.read_text())
    assert len(durations) == 4 and all(0.7 < seconds < 60 for seconds in durations.values()), durations
    # The next run estimates the time left from these durations, and says no longer that it is rough
    done, _ = _run(tmp_path, *(xdist or ["-p", "no:xdist"]))
    assert "rough" not in done.stdout and "left" in done.stdout, done.stdout


def _progress(tmp_path: Path, history: dict, workers: int | None, now: list[float]) -> SuiteProgress:
    (tmp_path / "h.json").write_text(json.dumps(history))
    config = SimpleNamespace(option=SimpleNamespace(numprocesses=workers),
                             pluginmanager=SimpleNamespace(get_plugin=lambda name: None))
    return SuiteProgress(config, tmp_path / "h.json", interval=0, clock=lambda: now[0], recorded=tmp_path / "none")


def _finish(progress: SuiteProgress, nodeid: str, failed: bool = False) -> None:
    for when in ("setup", "call", "teardown"):
        progress.report(SimpleNamespace(nodeid=nodeid, when=when, duration=1.0, skipped=False,
                                        failed=failed and when == "call"))


def test_time_left_divides_the_last_runs_durations_of_the_remaining_tests_among_the_workers(tmp_path, capsys):
    now = [0.0]
    progress = _progress(tmp_path, {"a": 100.0, "b": 60.0, "c": 20.0, "d": 20.0}, 2, now)
    progress.collected(["a", "b", "c", "d"])
    assert progress.time_left() == "about 1 min 40 s left"  # (100 + 60 + 20 + 20) / 2 workers
    _finish(progress, "a", failed=True)
    now[0] = 100.0
    assert progress.time_left() == "about 50 s left"
    assert progress.line() == "1 of 4 tests done, 1 failed, 1 min 40 s so far, about 50 s left"
    for nodeid in "bcd":
        _finish(progress, nodeid)
    assert progress.time_left() == "finishing"


def test_without_a_last_run_the_time_left_follows_the_pace_and_says_it_is_rough(tmp_path):
    now = [0.0]
    progress = _progress(tmp_path, {}, None, now)
    progress.collected(["a", "b", "c", "d"])
    assert progress.time_left() == "time left not known yet (no last run to go by)"
    _finish(progress, "a")
    now[0] = 30.0
    assert progress.time_left() == "about 1 min 30 s left (rough: no last run to go by)"
    # a fresh clone: the durations recorded on the course's CI machine, said so
    (tmp_path / "ci.json").write_text(json.dumps({"a": 5.0, "b": 7.0, "c": 8.0, "d": 100.0}))
    fresh = SuiteProgress(progress.config, tmp_path / "none.json", interval=0, clock=lambda: now[0],
                          recorded=tmp_path / "ci.json")
    fresh.collected(["a", "b", "c", "d"])
    assert fresh.time_left() == "about 2 min 0 s left (at the pace of the course's CI machine, busy: no last run here)"
    skipped = SimpleNamespace(nodeid="b", when="setup", duration=0.0, skipped=True, failed=False)
    progress.report(skipped)  # a test skipped at set-up has finished too
    assert progress.line().startswith("2 of 4 tests done, 0 failed")
