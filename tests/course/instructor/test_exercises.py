"""Exercise stubs are generated from the solutions, stay in step with them, and keep the same signatures."""

from __future__ import annotations

import ast
import re

import pytest

from course_lib.instructor.exercises import StubError, expected_stubs, main, make_stub

from course_lib.paths import ROOT


@pytest.fixture
def only_on_the_course_repo(request):
    # A learner's exercises/ differs from the stubs by design: compare only when grading the solutions.
    if request.config.getoption("--target") != "solutions":
        pytest.skip("compares the committed stubs with the solutions; runs with --target solutions")


def test_exercises_folder_is_up_to_date(only_on_the_course_repo):
    stubs = expected_stubs(ROOT / "solutions")
    assert stubs, "no solutions/ex*.py found"
    for name, text in stubs.items():
        path = ROOT / "exercises" / name
        assert path.exists(), f"exercises/{name} is missing: run python -m course_lib.exercises"
        assert path.read_text() == text, f"exercises/{name} is out of date: run python -m course_lib.exercises"
    extra = {p.name for p in (ROOT / "exercises").glob("ex*.py")} - set(stubs)
    assert not extra, f"exercises without a solution: {extra}"


def _signatures(source: str) -> dict[str, str]:
    """Public functions and methods at module and class level (helpers inside a solution block don't count)."""
    nodes = []
    for node in ast.parse(source).body:
        nodes.append(node)
        if isinstance(node, ast.ClassDef):
            nodes += node.body
    return {node.name: ast.unparse(node.args) + " -> " + (ast.unparse(node.returns) if node.returns else "")
            for node in nodes if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}


@pytest.mark.parametrize("solution", sorted((ROOT / "solutions").glob("ex*.py")), ids=lambda p: p.stem)
def test_stub_keeps_signatures_and_contains_no_solution(solution):
    source = solution.read_text()
    stub = make_stub(source, solution.stem)
    assert _signatures(stub) == _signatures(source)
    assert "BEGIN SOLUTION" not in stub and "END SOLUTION" not in stub
    raises = re.findall(r"^\s*raise NotImplementedError\(", stub, flags=re.M)
    assert len(raises) == source.count("# BEGIN SOLUTION")
    compile(stub, solution.name, "exec")


SOLUTION = '''def double(x):
    """Twice x."""
    # BEGIN SOLUTION: multiply by two
    y = x * 2
    return y
    # END SOLUTION
'''


def test_make_stub_replaces_the_block_with_the_hint():
    stub = make_stub(SOLUTION, "ex99_demo")
    assert "raise NotImplementedError('multiply by two')" in stub
    assert "x * 2" not in stub
    assert '"""Twice x."""' in stub
    namespace = {}
    exec(stub, namespace)
    with pytest.raises(NotImplementedError, match="multiply by two"):
        namespace["double"](3)


@pytest.mark.parametrize(
    "broken, message",
    [
        ("# BEGIN SOLUTION\nx = 1\n", "never closed"),
        ("x = 1\n# END SOLUTION\n", "no BEGIN"),
        ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "inside the block"),
        ("x = 1\n", "no '# BEGIN SOLUTION' block"),
    ],
)
def test_unbalanced_markers_are_reported_with_the_line(broken, message):
    with pytest.raises(StubError, match=message):
        make_stub(broken, "ex99_demo")


def test_regenerating_backs_up_an_edited_exercise(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir()
    exercises.mkdir()
    (solutions / "ex99_demo.py").write_text(SOLUTION)
    (exercises / "ex99_demo.py").write_text("# my work in progress\n")
    assert main(["--solutions", str(solutions), "--exercises", str(exercises), "--check"]) == 1
    assert main(["--solutions", str(solutions), "--exercises", str(exercises)]) == 0
    backups = list((exercises / ".backup").glob("ex99_demo.*.py"))
    assert len(backups) == 1 and backups[0].read_text() == "# my work in progress\n"
    assert main(["--solutions", str(solutions), "--exercises", str(exercises), "--check"]) == 0
