"""--exit-fast (check and the grader's judges): pytest leaves without the interpreter's teardown of torch's modules,
with its own exit status, everything it printed, its report, and every other exit handler run first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from course_lib.paths import ROOT

TESTS = textwrap.dedent("""
    import atexit, os, pathlib
    import torch  # the teardown --exit-fast skips is torch's

    atexit.register(lambda: pathlib.Path(os.environ["HANDLER_RAN"]).write_text("yes"))

    def test_passes():
        assert torch.ones(1).item() == 1

    def test_{outcome}():
        assert {outcome!r} == "passes_too"
""")


@pytest.mark.parametrize("outcome, status", [("passes_too", 0), ("fails", 1)])
def test_exit_fast_keeps_the_status_the_output_the_report_and_other_exit_handlers(tmp_path, outcome, status):
    (tmp_path / "test_tiny.py").write_text(TESTS.format(outcome=outcome))
    (tmp_path / "none.ini").write_text("[pytest]\n")
    report, handler = tmp_path / "report.jsonl", tmp_path / "handler_ran"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_tiny.py"), "-c", str(tmp_path / "none.ini"),
         "--rootdir", str(tmp_path), "-p", "course_lib.grading.plugin", "-p", "no:cacheprovider",
         "--target", str(ROOT / "solutions"), "--course-report", str(report), "--exit-fast", "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**_environment(), "HANDLER_RAN": str(handler)})
    assert done.returncode == status, done.stdout + done.stderr
    summary = "2 passed" if status == 0 else "1 failed, 1 passed"
    assert summary in done.stdout, done.stdout  # the last lines pytest printed were flushed before it left
    records = [json.loads(line) for line in report.read_text().splitlines()]
    assert records[-1] == {"exitstatus": status}
    assert handler.read_text() == "yes", "an exit handler of the tests did not run"


def _environment() -> dict:
    return {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
