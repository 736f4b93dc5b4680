"""A stub, a hang or a memory kill fails a property test at once: Hypothesis tries no other input (issue 20)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from course_lib.grading.results import read_report
from course_lib.paths import ROOT


def test_a_stub_fails_a_property_test_on_its_first_input(tmp_path):
    (tmp_path / "ex77_demo.py").write_text("def double(x):\n    raise NotImplementedError('return 2 * x')\n")
    test = tmp_path / "test_ex77_demo.py"
    test.write_text(textwrap.dedent("""
        import pytest
        from hypothesis import given, settings, strategies as st
        from course_lib.grading import call

        CALLS = []

        @pytest.mark.points(1)
        @settings(max_examples=10)
        @given(st.integers(0, 10**6))
        def test_double(x):
            CALLS.append(x)
            assert call("ex77", "double", x) == 2 * x

        def test_tried_once():
            assert len(CALLS) == 1, CALLS
        """))
    report = tmp_path / "report.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", str(test), "--rootdir", str(ROOT), "-c",
                           str(ROOT / "pyproject.toml"), "--target", str(tmp_path), "--course-report", str(report),
                           "-q", "-p", "no:randomly"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    tests = {t.nodeid.split("::")[-1]: t for t in read_report(report).tests.values()}
    assert tests["test_double"].outcome == "failed", done.stdout[-2000:]
    assert tests["test_double"].message.startswith("ex77: not implemented yet (hint: return 2 * x)")
    assert tests["test_tried_once"].outcome == "passed", tests["test_tried_once"].message
