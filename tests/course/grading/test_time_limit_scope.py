"""A test's time limit (--test-timeouts, the grader's and check's) covers the test's call, where the learner's code
runs: a fixture's slow teardown neither fails the test nor, by leaving pytest's setup state broken, the next one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from course_lib.paths import ROOT

TESTS = textwrap.dedent("""
    import time
    import pytest

    @pytest.fixture
    def slow_teardown():
        yield
        time.sleep(1.5)

    def test_passes_then_tears_down_slowly(slow_teardown):
        pass

    def test_after_it():
        pass

    def test_runs_past_its_limit():
        time.sleep(3)
""")


def test_the_limit_is_the_calls_and_a_slow_teardown_costs_nothing(tmp_path):
    (tmp_path / "test_tiny.py").write_text(TESTS)
    (tmp_path / "none.ini").write_text("[pytest]\n")
    names = ["test_passes_then_tears_down_slowly", "test_after_it", "test_runs_past_its_limit"]
    (tmp_path / "limits.json").write_text(json.dumps({f"test_tiny.py::{name}": 1.0 for name in names}))
    report = tmp_path / "report.jsonl"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_tiny.py"), "-c", str(tmp_path / "none.ini"),
         "--rootdir", str(tmp_path), "-p", "course_lib.grading.plugin", "-p", "no:cacheprovider",
         "-o", "timeout_method=signal", "--target", str(ROOT / "solutions"), "--course-report", str(report),
         "--test-timeouts", str(tmp_path / "limits.json"), "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment)
    outcomes = {}
    for line in report.read_text().splitlines():
        record = json.loads(line)
        if "test" in record:
            outcomes[record["test"]["nodeid"].split("::")[-1]] = (record["test"]["outcome"], record["test"]["message"])
    output = done.stdout + done.stderr
    assert outcomes["test_passes_then_tears_down_slowly"][0] == "passed", output
    assert outcomes["test_after_it"][0] == "passed", output
    assert outcomes["test_runs_past_its_limit"][0] == "failed", output
    assert "Timeout (>1.0s)" in outcomes["test_runs_past_its_limit"][1], output
