"""The reference solutions' calibration is cached test file by test file, and one calibration runs at a time, so
that graders of different exercises on one machine share what they have in common (the course's own tests grade a
class on ex00 while they build a Gradescope package of ex00 and ex05: ex00 is graded once). The judge is stood in
for: these tests are about which files get graded, not about grading."""

from __future__ import annotations

import fcntl
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from course_lib.instructor.grade import time_limits
from course_lib.instructor.grade.judge import Judge
from course_lib.instructor.grade.student import Settings

FILES = {"tests/test_ex00_warmup.py": ["test_a", "test_b"], "tests/test_ex05_ddp.py": ["test_c"],
         "tests/hidden/test_ex00_hidden.py": ["test_d"]}


@pytest.fixture
def judge_folder(tmp_path, monkeypatch):
    folder = tmp_path / "judge"
    for test, names in FILES.items():
        (folder / test).parent.mkdir(parents=True, exist_ok=True)
        (folder / test).write_text("".join(f"def {name}(): pass\n" for name in names))
    monkeypatch.setattr(time_limits, "CACHE", tmp_path / "cache")
    graded: list[list[str]] = []

    def fake_grade_reference(s, uid):  # what the judge would measure: 1 s a test; its run 10 s a file
        graded.append(list(s.judge.tests))
        durations = {f"{test}::{name}": 1.0 for test in s.judge.tests for name in FILES[test]}
        return {"durations": durations, "seconds": 10.0 * len(s.judge.tests), "memory_peak_bytes": 100}

    monkeypatch.setattr(time_limits, "_grade_reference", fake_grade_reference)
    return folder, graded


def _settings(tmp_path: Path, folder: Path, tests: list[str]) -> Settings:
    return Settings(out=tmp_path / "out", work=tmp_path, judge=Judge(folder, tests),
                    isolation=SimpleNamespace(mode="bwrap"), timeout=600, test_timeout=120, memory_bytes=0,
                    rlimit_as_bytes=0, max_processes=0, gpu_memory_fraction=0, hide=[])


def test_files_graded_once_are_shared_by_the_next_grader(judge_folder, tmp_path):
    folder, graded = judge_folder
    first = time_limits.calibrate(_settings(tmp_path, folder, ["tests/test_ex00_warmup.py",
                                                               "tests/hidden/test_ex00_hidden.py"]), None)
    assert graded == [["tests/test_ex00_warmup.py", "tests/hidden/test_ex00_hidden.py"]] and not first.cached
    assert first.reference_seconds == pytest.approx(20.0)
    # A Gradescope package of ex00 and ex05: only ex05's file is graded now
    second = time_limits.calibrate(_settings(tmp_path, folder, list(FILES)), None)
    assert graded[1:] == [["tests/test_ex05_ddp.py"]] and not second.cached
    assert set(second.reference_durations) == {f"{t}::{n}" for t, names in FILES.items() for n in names}
    assert second.reference_seconds == pytest.approx(30.0)  # 20 s cached for ex00's two files, 10 s now
    third = time_limits.calibrate(_settings(tmp_path, folder, ["tests/test_ex05_ddp.py"]), None)
    assert len(graded) == 2 and third.cached
    # A changed test file is graded again; --recalibrate (use_cache=False) grades everything again
    (folder / "tests/test_ex05_ddp.py").write_text("def test_c(): assert True\n")
    time_limits.calibrate(_settings(tmp_path, folder, ["tests/test_ex05_ddp.py"]), None)
    time_limits.calibrate(_settings(tmp_path, folder, ["tests/test_ex00_warmup.py"]), None, use_cache=False)
    assert graded[2:] == [["tests/test_ex05_ddp.py"], ["tests/test_ex00_warmup.py"]]


def test_a_second_grader_waits_for_the_first_calibration_and_uses_it(judge_folder, tmp_path, capfd):
    folder, graded = judge_folder
    time_limits.CACHE.mkdir(parents=True)
    held = open(time_limits.CACHE / "calibrating.lock", "a+")  # another grader, calibrating
    fcntl.flock(held, fcntl.LOCK_EX)
    results = []
    waiting = threading.Thread(target=lambda: results.append(
        time_limits.calibrate(_settings(tmp_path, folder, ["tests/test_ex00_warmup.py"]), None)))
    try:
        waiting.start()
        time.sleep(0.5)
        assert waiting.is_alive() and not graded, "the second grader calibrated while the first one was"
        # the first grader finishes ex00's file: it is in the cache when the second one goes on
        s = _settings(tmp_path, folder, ["tests/test_ex00_warmup.py"])
        entry = {"durations": {"tests/test_ex00_warmup.py::test_a": 2.0, "tests/test_ex00_warmup.py::test_b": 2.0},
                 "seconds": 7.0, "memory_peak_bytes": 5}
        (time_limits.CACHE / f"reference-{time_limits.cache_key(s, 'tests/test_ex00_warmup.py')}.json").write_text(
            json.dumps(entry))
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        held.close()
        waiting.join(timeout=30)
    assert not graded and results and results[0].cached and results[0].reference_seconds == 7.0
    assert "another grader is calibrating the reference solutions on this machine" in capfd.readouterr().err
