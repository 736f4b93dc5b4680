"""The learner's check: progress as tests finish, the grader's time limits, where the learner's code failed, and a
table that fits the terminal (course_lib/check.py runs the tests; check_result.py, check_display.py and
check_failures.py beside it).

The tests marked "runs pytest" grade a copy of solutions/ex00 that is broken on purpose, in a tmp folder, with
`--target`: a syntax error; and an error three calls deep in shard_range beside an all_reduce_mean that is
correct but slower than the grader allows.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib import check as check_module
from course_lib.check import CheckResult, Progress, TimeRule, run_check
from course_lib.grading.results import TestOutcome
from course_lib.instructor.grade.cli import _parser as grader_parser
from course_lib.instructor.grade.time_limits import calibrated_limits
from course_lib.paths import ROOT, SOLUTIONS, TESTS

SHARD = "tests/test_ex00_warmup.py::test_shard_range_matches_tensor_split"
MEAN = "tests/test_ex00_warmup.py::test_all_reduce_mean_matches_single_process_mean"
REFERENCE = 2.5  # seconds: the grader allows 10 s (4 × 2.5 s) and check stops the test at 20 s
SLEEP = 10.5  # seconds the slow answer sleeps, once: then the test takes over 10 s and under 20 s


def _outcome(nodeid: str, outcome: str = "failed", message: str = "", points: int = 2, duration: float = 1.0):
    return TestOutcome(nodeid, points, outcome, message, duration=duration)


def _rule(**reference: float) -> TimeRule:
    grader = grader_parser()
    return TimeRule(grader.get_default("time_factor"), grader.get_default("time_floor"),
                    grader.get_default("test_timeout"), reference)


# ------------------------------------------------------------------------------------------------ without pytest


def test_the_time_limits_are_the_graders_rule():
    grader = grader_parser()
    rule = TimeRule.load(None)
    assert (rule.factor, rule.floor, rule.ceiling) == (
        grader.get_default("time_factor"), grader.get_default("time_floor"), grader.get_default("test_timeout"))
    reference = {"a": 0.1, "b": 2.0, "c": 1000.0}
    rule.reference = reference
    expected = calibrated_limits(reference, rule.factor, rule.floor, rule.ceiling)
    assert {nodeid: rule.grader_limit(nodeid) for nodeid in reference} == expected
    assert rule.grader_limit("unknown") is None and rule.stop_after("unknown") == rule.ceiling
    assert rule.stop_after("a") == 2 * expected["a"] and rule.stop_after("c") == rule.ceiling


def test_a_pass_slower_than_the_grader_allows_earns_nothing_and_says_why():
    rule = _rule(**{SHARD: 2.0, MEAN: 2.0})  # the grader allows 8 s each
    limit = rule.grader_limit(SHARD)
    slow = CheckResult("ex00", [_outcome(SHARD, "passed", duration=limit + 1.1),
                                _outcome(MEAN, "passed", duration=limit - 0.1)], rule=rule)
    assert slow.earned == 2 and slow.possible == 4 and not slow.all_passed
    text = slow.format(width=120)
    assert f"passed in {limit + 1.1:.1f} s; the grader allows about {limit:g} s" in " ".join(text.split())
    assert "lose its 2 points" in " ".join(text.split()) and "too slow" in text
    assert "too slow" in slow._repr_html_() and "ex00: 2 / 4 points" in text
    quick = CheckResult("ex00", [_outcome(SHARD, "passed", duration=limit - 0.1)], rule=rule)
    assert quick.all_passed and quick.earned == 2 and "too slow" not in quick.format()


def test_a_test_stopped_at_its_limit_says_what_the_grader_allows():
    rule = _rule(**{SHARD: 2.0})
    stopped = CheckResult("ex00", [_outcome(SHARD, message="Failed: Timeout (>16.0s) from pytest-timeout.")],
                          rule=rule)
    text = " ".join(stopped.format(width=100).split())
    assert "stopped after 16 s (the grader allows about 8 s)" in text and "pytest-timeout" not in text


LONG = ("ex03: scatter(tensor, 4) on rank 2 should return the rows 6 to 8 of the input, as a new tensor; got a "
        "tensor of shape (2, 3) with the values tensor([[0., 1., 2.], [3., 4., 5.]]) (the rows of rank 0)")


def _long_result() -> CheckResult:
    return CheckResult("ex03", [
        _outcome("tests/test_ex03_data_parallel.py::test_scatter_returns_each_ranks_rows[2]",
                 message=LONG + "\n\nTraceback (most recent call last):\n  more detail on a second line"),
        _outcome("tests/test_ex03_data_parallel.py::test_gather", "passed")])


@pytest.mark.parametrize("width", [60, 80, 140, 200])
def test_the_text_table_fits_the_width_and_wraps_rather_than_cuts(width):
    text = _long_result().format(width=width)
    assert max(map(len, text.splitlines())) <= width, text
    assert "got a tensor of shape (2, 3)" in " ".join(text.split()), text  # the half a cut at 100 lost
    assert "more detail on a second line" not in text


def test_verbose_shows_whole_messages():
    text = _long_result().format(width=100, verbose=True)
    assert "more detail on a second line" in text and max(map(len, text.splitlines())) <= 100


def test_the_table_is_the_terminals_width_and_a_notebooks_at_most(monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    wide = str(_long_result())
    assert 100 < max(map(len, wide.splitlines())) <= 200
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # in a notebook's kernel, whatever its stdout is
    assert max(map(len, str(_long_result()).splitlines())) <= check_module.NOTEBOOK_WIDTH


SYNTAX = '''ex00: SyntaxError: '(' was never closed

Traceback (most recent call last):
  File "{root}/course_lib/grading/runner.py", line 110, in _in_child
    module = load_exercise_file(path)
             ^^^^^^^^^^^^^^^^^^^^^^^^
  File "<frozen importlib._bootstrap_external>", line 936, in exec_module
  File "{target}/ex00_warmup.py", line 26
    base, extra = divmod(num_items, world_size
                        ^
SyntaxError: '(' was never closed
Failing explicit example: test_shard_range_matches_tensor_split(
    cases=[(10, 4)],
)'''


def test_where_the_code_failed_shows_once_with_the_learners_frames_only(tmp_path):
    message = SYNTAX.format(root=ROOT, target=tmp_path)
    result = CheckResult("ex00", [_outcome(SHARD, message=message), _outcome(MEAN, message=message)],
                         target=tmp_path)
    (names, shown), = result.where_it_failed()
    assert names == ["test_shard_range_matches_tensor_split", "test_all_reduce_mean_matches_single_process_mean"]
    assert shown.splitlines()[0] == f'File "{tmp_path}/ex00_warmup.py", line 26'
    assert shown.splitlines()[-1] == "SyntaxError: '(' was never closed"
    assert "runner.py" not in shown and "importlib" not in shown
    # Once, and whole even where the path is longer than the line: a frame is never wrapped (a path to click).
    for text in (result.format(width=100), result.format(width=40), result._repr_html_()):
        assert text.count("line 26") == 1


def test_a_mistyped_exercise_lists_the_exercises(capsys):
    with pytest.raises(SystemExit) as exit:
        check_module.main(["ex9"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "Traceback" not in err
    assert "no exercise 'ex9'; the exercises are ex00, ex01" in err


def _graded_functions(path: Path) -> set[str]:
    """The test functions of a file that carry points and need no GPU (those a CPU machine can time)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            marks = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
            if "pytest.mark.points" in marks and "pytest.mark.gpu" not in marks:
                found.add(node.name)
    return found


def test_the_committed_reference_times_cover_every_graded_test():
    data = json.loads(check_module.REFERENCE_TIMES.read_text())
    recorded = {nodeid.split("::")[1].partition("[")[0] for nodeid in data["durations"]}
    for path in sorted(TESTS.glob("test_ex*_*.py")):
        missing = _graded_functions(path) - recorded
        assert not missing, (f"no reference time for {sorted(missing)}: run "
                             f"python -m course_lib.check --record-reference-times {path.name.split('_')[1]}")
    assert all(0 < seconds < 120 for seconds in data["durations"].values()) and data["measured_on"]


# ------------------------------------------------------------------------------------------------ runs pytest


def _broken_copy(folder: Path, old: str, new: str, extra: str = "") -> Path:
    folder.mkdir()
    source = (SOLUTIONS / "ex00_warmup.py").read_text()
    assert old in source
    (folder / "ex00_warmup.py").write_text(source.replace(old, new, 1) + extra)
    return folder


DIVIDE = "    base, extra = divmod(num_items, world_size)\n"
DEEP = '''

def _split(num_items, world_size):
    return _divide(num_items, world_size)


def _divide(num_items, world_size):
    return divmod(num_items, world_size - world_size)
'''
SLOW = f'''

def all_reduce_mean(tensor):  # correct, but the first call ever sleeps {SLEEP:g} s
    import os, time
    mark = os.path.join(os.path.dirname(__file__), "slept")
    if not os.path.exists(mark):
        open(mark, "w").close()
        time.sleep({SLEEP})
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()
'''


class Recorded(Progress):
    def __init__(self):
        self.events = []

    def collected(self, count):
        self.events.append(("collected", count))

    def running(self, nodeid, seconds, limit):
        self.events.append(("running", nodeid, seconds, limit))

    def finished(self, test, so_far):
        self.events.append(("finished", test.nodeid, so_far.earned, len(so_far.tests)))


@pytest.fixture(scope="module")
def deep_and_slow(tmp_path_factory):
    """check on an ex00 whose shard_range fails three calls deep and whose all_reduce_mean is slow but correct."""
    root = tmp_path_factory.mktemp("check")
    target = _broken_copy(root / "exercises", DIVIDE, "    base, extra = _split(num_items, world_size)\n",
                          DEEP + SLOW)
    times = root / "reference_times.json"
    times.write_text(json.dumps({"durations": {SHARD: REFERENCE, MEAN: REFERENCE}, "measured_on": "a test"}))
    progress = Recorded()
    quick = os.environ.get("COURSE_HYPOTHESIS")
    os.environ["COURSE_HYPOTHESIS"] = "quick"  # explicit examples and two drawn inputs: seconds, not tens
    try:
        result = run_check("ex00", str(target), progress=progress, reference_times=times,
                           select="test_shard_range_matches_tensor_split or test_all_reduce_mean_matches")
    finally:
        if quick is None:
            os.environ.pop("COURSE_HYPOTHESIS")
        else:
            os.environ["COURSE_HYPOTHESIS"] = quick
    return target, result, progress


def test_a_slow_but_correct_answer_is_shown_too_slow(deep_and_slow):
    target, result, _ = deep_and_slow
    mean, = [t for t in result.tests if t.nodeid == MEAN]
    assert mean.outcome == "passed" and SLEEP < mean.duration < result.rule.stop_after(MEAN), result.output[-2000:]
    assert result.too_slow(mean) and result.earned == 0 and not result.all_passed
    text = " ".join(result.format(width=100).split())
    assert f"passed in {mean.duration:.1f} s; the grader allows about 10 s: make it faster" in text


def test_progress_shows_each_test_as_it_finishes_and_the_limit_of_a_long_one(deep_and_slow):
    _, _, progress = deep_and_slow
    assert progress.events[0] == ("collected", 2)
    finished = [e for e in progress.events if e[0] == "finished"]
    assert [e[1] for e in finished] == [SHARD, MEAN] and [e[3] for e in finished] == [1, 2]
    waits = [e for e in progress.events if e[0] == "running" and e[1] == MEAN]
    assert max(e[2] for e in waits) > SLEEP / 2 and {e[3] for e in waits} == {20}  # 2 × the grader's 10 s


def test_a_runtime_error_shows_the_learners_three_frames(deep_and_slow):
    target, result, _ = deep_and_slow
    (names, shown), = result.where_it_failed()
    source = (target / "ex00_warmup.py").read_text().splitlines()
    lines = [n + 1 for n, line in enumerate(source)
             if "= _split(num_items" in line or "return _divide(" in line or "world_size - world_size" in line]
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', shown)
    assert [(Path(f).name, int(n), fn) for f, n, fn in frames] == [
        ("ex00_warmup.py", lines[0], "shard_range"), ("ex00_warmup.py", lines[1], "_split"),
        ("ex00_warmup.py", lines[2], "_divide")], shown
    assert shown.splitlines()[-1].startswith("ZeroDivisionError") and names == ["test_shard_range_matches_tensor_split"]
    assert "course_lib" not in shown and "site-packages" not in shown


def test_the_terminal_check_names_the_file_and_line_of_a_syntax_error(tmp_path):
    target = _broken_copy(tmp_path / "exercises", DIVIDE, "    base, extra = divmod(num_items, world_size\n")
    line = next(n + 1 for n, text in enumerate((target / "ex00_warmup.py").read_text().splitlines())
                if text.endswith("divmod(num_items, world_size"))
    done = subprocess.run([sys.executable, "-m", "course_lib.check", "ex00", "--target", str(target),
                           "-k", "test_shard_range_matches_tensor_split"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "80"}, timeout=600)
    out = done.stdout
    assert done.returncode == 1 and "✘ FAILED   test_shard_range_matches_tensor_split" in out, out + done.stderr
    table, _, where = out.partition("where your code failed")
    assert max(map(len, table.splitlines())) <= 80, out  # a path below it stays whole, however long
    where = " ".join(where.split())
    assert f'File "{target}/ex00_warmup.py", line {line}' in where and "SyntaxError" in where
    assert "course_lib" not in where and "Traceback" not in done.stderr
