"""The course's Hypothesis set-up: the profiles graded tests run under, and the shared strategies (issue 20)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import OrderedDict, UserDict, defaultdict

import torch
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from course_lib.grading import plugin
from course_lib.grading.properties import (CONTAINERS, Pair, Triple, batch_tensors, describe, device_lists, nested,
                                           plain_values)
from course_lib.paths import ROOT


def test_the_grading_profile_is_loaded_and_gives_the_same_inputs_every_run():
    current = settings.default
    assert current.derandomize and current.database is None and current.deadline is None
    assert Phase.shrink in current.phases, "learners see the smallest failing input"


def test_the_selfcheck_profile_does_not_shrink(monkeypatch):
    monkeypatch.setenv(plugin.PROFILE_VARIABLE, "selfcheck")
    try:
        assert plugin.load_hypothesis_profile() == "selfcheck"
        assert Phase.shrink not in settings.default.phases and settings.default.derandomize
    finally:
        monkeypatch.delenv(plugin.PROFILE_VARIABLE)
        plugin.load_hypothesis_profile()


def _kinds(value, found):
    found.add(type(value).__name__)
    children = value.values() if isinstance(value, (dict, UserDict)) else value if isinstance(value, (list, tuple)) else ()
    for child in children:
        _kinds(child, found)
    return found


def test_nested_reaches_every_container_kind():
    for name, expected in [("list", list), ("tuple", tuple), ("dict", dict), ("OrderedDict", OrderedDict),
                           ("defaultdict", defaultdict), ("UserDict", UserDict), ("Pair", Pair), ("Triple", Triple)]:
        value = find(nested(st.integers(), containers=(name,)), lambda v: not isinstance(v, int),
                     settings=settings(database=None))
        assert type(value) is expected, (name, value)
    assert set(CONTAINERS) == {"list", "tuple", "dict", "OrderedDict", "defaultdict", "UserDict", "Pair", "Triple"}


@settings(max_examples=30)
@given(batch_tensors(rows=3), device_lists(min_size=2, max_size=3), plain_values())
def test_the_leaf_strategies_keep_their_promises(tensor, devices, value):
    assert tensor.shape[0] == 3 and tensor.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64,
                                                     torch.bool)
    assert 2 <= len(devices) <= 3 and set(devices) <= {"cpu", "meta"}
    assert not isinstance(value, torch.Tensor)


def test_non_contiguous_tensors_are_drawn():
    transposed = find(batch_tensors(rows=2), lambda t: not t.is_contiguous(), settings=settings(database=None))
    assert transposed.dim() >= 2 and transposed.clone().equal(transposed)


def test_describe_is_plain_data():
    value = OrderedDict(x=torch.ones(2, 3, dtype=torch.bfloat16), pair=Pair([1, "a"], None))
    assert describe(value) == {"OrderedDict": [
        ["x", {"tensor": ["cpu", "torch.bfloat16", [2, 3]]}],
        ["pair", {"Pair": [{"list": [{"value": ["int", "1"]}, {"value": ["str", "'a'"]}]},
                           {"value": ["NoneType", "None"]}]}]]}


def test_a_failing_property_reports_its_smallest_input_to_the_learner(tmp_path):
    """What `check` and the grader show: the report's message holds Hypothesis's shrunk failing case."""
    test = tmp_path / "test_ex77_demo.py"
    test.write_text(textwrap.dedent("""
        import pytest
        from hypothesis import given, strategies as st

        @pytest.mark.points(1)
        @given(st.lists(st.integers(0, 1000), min_size=1))
        def test_sum_is_small(values):
            assert sum(values) < 100, f"the sum of {values} is {sum(values)}"
        """))
    report = tmp_path / "report.jsonl"
    subprocess.run([sys.executable, "-m", "pytest", str(test), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
                    "--target", "solutions", "--course-report", str(report), "-q"], cwd=ROOT, capture_output=True,
                   timeout=120)
    from course_lib.grading.results import read_report

    outcome = read_report(report).graded()[0]
    assert outcome.outcome == "failed"
    assert "values=[100]" in outcome.message, outcome.message


def test_check_shows_the_smallest_failing_input_under_the_table_and_in_the_notebook():
    from course_lib.check import CheckResult, smallest_failing_input
    from course_lib.grading.results import TestOutcome

    newer = "ex03: got 3 chunks\nassert 3 == 2\nFailing test case: test_scatter(\n    cases=[(5, 2)],\n    dim=-1,\n)"
    older = "wrong\nFalsifying example: test_scatter(cases=[(5, 2)], dim=-1)"
    assert smallest_failing_input(newer) == smallest_failing_input(older) == "cases=[(5, 2)], dim=-1"
    assert smallest_failing_input("ex03: not a property test") == ""
    stub = "ex03: not implemented yet (hint: chunk)\nFailing test case: test_gather(\n    parts=[],\n)"
    result = CheckResult("ex03", [TestOutcome("tests/test_ex03.py::test_scatter", 2, "failed", newer),
                                  TestOutcome("tests/test_ex03.py::test_gather", 2, "failed", stub)])
    assert "  test_scatter: cases=[(5, 2)], dim=-1" in str(result) and "parts=[]" not in str(result)
    assert "smallest failing input: <code>cases=[(5, 2)], dim=-1</code>" in result._repr_html_()
