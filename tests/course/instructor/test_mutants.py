"""The mutation check (course_lib.instructor.mutants): the mutants it makes, and its report on a tiny course."""

from __future__ import annotations

from pathlib import Path

from course_lib.instructor import mutants
from course_lib.paths import ROOT


SMALL = '''import torch


def pick(x, y, z):
    """Outside the block: never mutated."""
    w = x + 1
    # BEGIN SOLUTION: a bit of everything
    if x < y and not z:
        return torch.cat([x, y], dim=0).sum()
    total = max(x, y)
    return total
    # END SOLUTION
'''


def _changes(made):
    return {(m.operator, m.new) for m in made}


def test_the_mutator_makes_each_kind_of_mutant_inside_the_block_only():
    made, skipped = mutants.mutate(SMALL, "ex99")
    assert not skipped
    assert [(m.line, m.operator, m.new) for m in made] == [
        (8, "drop_statement", "pass"),  # the whole if
        (8, "boolean", "if x < y or not z:"),
        (8, "comparison", "if x <= y and not z:"),
        (8, "remove_not", "if x < y and z:"),
        (9, "return_none", "return None"),
        (9, "sum_mean", "return torch.cat([x, y], dim=0).mean()"),
        (9, "dim", "return torch.cat([x, y], dim=1).sum()"),  # a dim is not an off-by-one constant
        (9, "dim", "return torch.cat([x, y], dim=-1).sum()"),
        (10, "drop_statement", "pass"),
        (10, "swap_args", "total = max(y, x)"),
        (11, "return_none", "return None"),
    ]  # and nothing on `w = x + 1`, line 6, outside the block
    assert {m.function for m in made} == {"pick"}
    for m in made:
        compile(m.source, "ex99.py", "exec")
        assert m.source != SMALL


def test_constants_move_by_one_and_equal_arguments_are_not_swapped():
    source = "def f(a, n):\n    # BEGIN SOLUTION\n    return g(a, a) + n * 2 + h(-1)\n    # END SOLUTION\n"
    made, skipped = mutants.mutate(source, "ex99")
    changes = _changes(made)
    assert ("constant", "return g(a, a) + n * 3 + h(-1)") in changes
    assert ("constant", "return g(a, a) + n * 1 + h(-1)") in changes
    assert ("constant", "return g(a, a) + n * 2 + h(0)") in changes
    assert ("constant", "return g(a, a) + n * 2 + h(-2)") in changes
    assert skipped["swap_args: the same program"] == 1  # g(a, a) swapped is g(a, a)


def test_dropping_an_elif_leaves_an_else():
    source = ("def f(x):\n    # BEGIN SOLUTION\n    if x:\n        y = 1\n    elif x is None:\n        y = 2\n"
              "    else:\n        y = 3\n    return y\n    # END SOLUTION\n")
    made, skipped = mutants.mutate(source, "ex99")
    assert not skipped
    dropped = [m for m in made if m.operator == "drop_statement" and m.line == 5]
    assert [m.new for m in dropped] == ["else: pass"]


def _changed_span(before: str, after: str) -> tuple[int, int]:
    """The first and last line of `before` that differ from `after` (common prefix and suffix left out)."""
    start = 0
    while start < min(len(before), len(after)) and before[start] == after[start]:
        start += 1
    end = 0
    while end < min(len(before), len(after)) - start and before[-1 - end] == after[-1 - end]:
        end += 1
    return before[:start].count("\n") + 1, before[: len(before) - end].count("\n") + 1


def test_every_mutant_of_every_solution_compiles_and_changes_only_a_solution_block():
    solutions = sorted((ROOT / "solutions").glob("ex*_*.py"))
    if not solutions:
        return  # a student release
    for path in solutions:
        source = path.read_text()
        blocks = mutants.solution_blocks(source)
        made, _ = mutants.mutate(source, path.stem[:4])
        assert made, path.name
        for m in made:
            compile(m.source, path.name, "exec")
            first, last = _changed_span(source, m.source)
            assert any(a <= first and last <= b for a, b in blocks), f"{m.name} {m.operator}: lines {first}-{last}"


def test_a_limit_is_a_fixed_sample_and_operators_filter():
    if not (ROOT / "solutions").is_dir():
        return
    every, _ = mutants.mutants_of("ex00", ROOT)
    some, _ = mutants.mutants_of("ex00", ROOT, limit=5)
    again, _ = mutants.mutants_of("ex00", ROOT, limit=5)
    assert len(some) == 5 and [m.number for m in some] == [m.number for m in again]
    assert {m.number for m in some} <= {m.number for m in every}
    only, _ = mutants.mutants_of("ex00", ROOT, operators=["comparison"])
    assert only and {m.operator for m in only} == {"comparison"}


SOLUTION = '''"""Exercise 99: a demo."""


def double(x):
    # BEGIN SOLUTION: multiply by two
    return 2 * x
    # END SOLUTION


def count_to(n):
    # BEGIN SOLUTION: count up
    i = 0
    while i < n:
        i += 1
    return i
    # END SOLUTION


def halve(x):
    # BEGIN SOLUTION: divide by two
    return x / 2
    # END SOLUTION
'''

TESTS = '''"""Graded tests of the demo: they load the graded file directly (no ranks); halve() is never tested."""
import importlib.util

import pytest


def _load(target):
    path = next(target.glob("ex99_*.py"))
    spec = importlib.util.spec_from_file_location("ex99_demo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.points(1)
def test_double(target):
    assert _load(target).double(3) == 6


@pytest.mark.points(1)
def test_count_to(target):
    assert _load(target).count_to(3) == 3
'''


def _fake_course(root: Path) -> None:
    (root / "solutions").mkdir()
    (root / "tests").mkdir()
    (root / "solutions" / "ex99_demo.py").write_text(SOLUTION)
    (root / "tests" / "test_ex99_demo.py").write_text(TESTS)
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p course_lib.grading.plugin\n")


def test_the_report_names_survivors_and_counts_a_hang_as_timed_out(tmp_path, capsys):
    _fake_course(tmp_path)
    # double: 2 / x and return None are killed; count_to: i -= 1 never ends (timed out), return None is killed;
    # halve is never tested: x * 2, x // 2 and return None survive.
    code = mutants.main(["--root", str(tmp_path), "ex99", "--jobs", "2", "--timeout", "10",
                         "--operator", "arithmetic", "--operator", "return_none"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("ex99  "))
    assert row.split()[:7] == ["ex99", "7", "3", "3", "1", "0", "57"], row
    survivors = [line for line in out.splitlines() if line.startswith("SURVIVED ")]
    assert len(survivors) == 3 and all("in halve, line 21" in line for line in survivors), out
    assert "-  return x / 2\n    +  return x // 2" in out
    assert any(line.startswith("TIMED OUT ") and "count_to, line 14" in line for line in out.splitlines()), out


def test_listing_grades_nothing_and_no_mutant_is_an_error(tmp_path, capsys):
    _fake_course(tmp_path)
    assert mutants.main(["--root", str(tmp_path), "--list", "--operator", "comparison"]) == 0
    out = capsys.readouterr().out
    assert "ex99#" in out and "+  while i <= n:" in out and "score" not in out
    (tmp_path / "solutions" / "ex99_demo.py").write_text("def double(x):\n    return 2 * x\n")
    assert mutants.main(["--root", str(tmp_path), "--list"]) == 1
    assert "no mutant could be made" in capsys.readouterr().out
