"""A function that runs out of time costs its own tests, not the grade: later tests of it fail at once (grading.loops)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

from course_lib.grading import loops
from course_lib.grading.results import read_report
from course_lib.grading.time_rule import AFTER_A_LOOP
from course_lib.paths import ROOT

EXERCISE = '''def double(x):
    while True:
        pass


class Counter:
    def add(self, x):
        def step(y):
            while True:
                y += 1
        return step(x)

    @staticmethod
    def twice(x):
        while True:
            pass


def triple(x):
    return 3 * x
'''

TESTS = '''
import pytest
from course_lib.grading import run

def _double(module, x):
    return module.double(x)

def _triple(module, x):
    return module.triple(x)

def _add(module, x):
    return module.Counter().add(x)

@pytest.mark.points(1)
def test_1_double(): assert run("ex77", _double, 2) == 4

@pytest.mark.points(1)
def test_2_double_again(): assert run("ex77", _double, 3) == 6

@pytest.mark.points(1)
def test_3_triple(): assert run("ex77", _triple, 3) == 9

@pytest.mark.points(1)
def test_4_add(): assert run("ex77", _add, 1) == 2

@pytest.mark.points(1)
def test_5_triple_after_two_loops(): assert run("ex77", _triple, 2) == 6
'''

OTHER = '''
import pytest
from course_lib.grading import call

@pytest.mark.points(1)
def test_other_exercise(): assert call("ex78", "half", 4) == 2
'''


def _pytest(tmp_path, *options):
    return subprocess.run([sys.executable, "-m", "pytest", str(tmp_path / "test_ex77_demo.py"),
                           str(tmp_path / "test_ex78_other.py"), "--rootdir", str(ROOT), "-c",
                           str(ROOT / "pyproject.toml"), "--target", str(tmp_path), "-q", "-p", "no:randomly",
                           "-p", "no:xdist", *options], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_looping_function_fails_its_later_tests_at_once_and_spares_the_rest(tmp_path):
    (tmp_path / "ex77_demo.py").write_text(EXERCISE)
    (tmp_path / "ex78_other.py").write_text("def half(x):\n    return x / 2\n")
    (tmp_path / "test_ex77_demo.py").write_text(TESTS)
    (tmp_path / "test_ex78_other.py").write_text(OTHER)
    collected = _pytest(tmp_path, "--collect-only", "--course-report", str(tmp_path / "collected.jsonl"))
    nodeids = [t.nodeid for t in (read_report(tmp_path / "collected.jsonl").collected or [])]
    assert len(nodeids) == 6, collected.stdout[-2000:] + collected.stderr[-2000:]
    # 2 s for the loops to run into; a generous limit everywhere else, and after a loop 2 s again (not the floor).
    limits = {nodeid: (2.0 if nodeid.endswith(("double", "add")) else 60.0) for nodeid in nodeids}
    limits[AFTER_A_LOOP] = {nodeid: (2.0 if nodeid.endswith("add") else 60.0) for nodeid in nodeids}
    (tmp_path / "limits.json").write_text(json.dumps(limits))
    report = tmp_path / "report.jsonl"
    done = _pytest(tmp_path, "--course-report", str(report), "--test-timeouts", str(tmp_path / "limits.json"))
    read = read_report(report)
    tests = {t.nodeid.split("::")[-1]: t for t in read.tests.values()}
    assert set(tests) == {"test_1_double", "test_2_double_again", "test_3_triple", "test_4_add",
                          "test_5_triple_after_two_loops", "test_other_exercise"}, done.stdout[-3000:]
    message = {name: t.message for name, t in tests.items()}
    # The first loop is found on the rank's stack, by its line in the learner's file.
    assert re.match(r"ex77: double \(line [23]\) was still running when time ran out; Timeout \(>2\.0s\) from "
                    r"pytest-timeout", message["test_1_double"]), message["test_1_double"]
    # Called again, it raises at once instead of looping to the limit (a loop would say "Timeout").
    assert message["test_2_double_again"].startswith(
        "ex77: double ran out of time in test_1_double, so it is not run again"), message["test_2_double_again"]
    assert tests["test_3_triple"].outcome == "passed", message["test_3_triple"]
    # A loop in a function nested in a method names the method, as the test's own call would.
    # (line 9 or 10: the loop's test or its body, wherever the stack was taken)
    assert re.match(r"ex77: Counter\.add \(line (9|10)\) was still running", message["test_4_add"]), message["test_4_add"]
    # Two loops in one exercise: its remaining tests are not run, and say why.
    assert tests["test_5_triple_after_two_loops"].outcome == "failed"
    assert re.match(r"ex77: not run, because 2 of this exercise's tests ran out of time \(double \(line [23]\) in "
                    r"test_1_double; Counter\.add \(line (9|10)\) in test_4_add\)",
                    message["test_5_triple_after_two_loops"]), message["test_5_triple_after_two_loops"]
    # Another exercise keeps its limits and its points; the report says which functions looped.
    assert tests["test_other_exercise"].outcome == "passed", message["test_other_exercise"]
    assert read.looped == {"ex77": ["double", "Counter.add"]}


def test_the_looping_function_is_the_innermost_frame_in_the_learners_file(tmp_path):
    path = tmp_path / "ex77_demo.py"
    path.write_text(EXERCISE)
    dump = textwrap.dedent(f"""\
        Timeout (0:00:01.700000)!
        Thread 0x00007f0000000000 (most recent call first):
          File "/usr/lib/python3.11/threading.py", line 320 in wait
          File "{path}", line 10 in step
          File "{path}", line 11 in add
          File "/work/course_lib/grading/runner.py", line 200 in _in_child
        """)
    assert loops.looping_function(dump, str(path)) == ("Counter.add", 10)
    assert loops.looping_function(dump, str(tmp_path / "elsewhere.py")) == ("", 0)
    assert loops.looping_function("", str(path)) == ("", 0)


def test_disabled_functions_raise_past_a_learners_except_exception(tmp_path):
    import importlib.util

    path = tmp_path / "ex77_demo.py"
    path.write_text(EXERCISE)
    spec = importlib.util.spec_from_file_location("ex77_demo_loops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loops.disable_looped(module, [("double", "t::test_a"), ("Counter.add", "t::test_b"), ("Counter.twice", "t::c"),
                                  ("no_such_function", "t::d")])
    for call in (lambda: module.double(1), lambda: module.Counter().add(1), lambda: module.Counter.twice(1),
                 lambda: module.Counter().twice(1)):
        try:
            try:
                call()
            except Exception:  # noqa: BLE001 - a learner's catch-all must not swallow it
                raise AssertionError("LoopedEarlier was caught by `except Exception`") from None
        except loops.LoopedEarlier as error:
            assert "so it is not run again" in str(error)
        else:
            raise AssertionError("the looped function ran")
    assert module.triple(2) == 6


def test_each_pytest_session_starts_without_the_loops_of_the_last():
    # The wrong-answer and mutant workers run pytest in-process, one graded file after another: the plugin's
    # pytest_configure calls reset(), so that a loop of one file cannot fail the next file's tests.
    loops.start_test("tests/test_ex77_demo.py::test_x", 5.0)
    loops.note("ex77", "double", 2)
    assert loops.loops_of("ex77") and loops.deadline() is not None
    loops.reset()
    assert loops.loops_of("ex77") == [] and loops.deadline() is None and loops.stopped_message("ex77") is None
