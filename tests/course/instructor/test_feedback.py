"""The feedback a stuck learner reads: each untouched stub once, with its hint; Hypothesis's examples only where the
code ran and gave a wrong answer; check()'s table grouped the same way (issue 34).

stub_run.json beside this file records what every graded test of the course said on the untouched stubs (each
test's first message line: which stub it stopped at). Record it again after adding an exercise:

    .venv/bin/python tests/course/instructor/test_feedback.py --record      (about 3 minutes)
"""

from __future__ import annotations

import html
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from course_lib.check import CheckResult, run_check
from course_lib.grading.results import TestOutcome, exercise_of, stub_groups, unwritten
from course_lib.grading.runner import stub_hints
from course_lib.instructor.grade.report import FEEDBACK_WIDTH, UNWRITTEN_HEADING, Result, write_feedback
from course_lib.paths import EXERCISES, ROOT, TESTS

RECORDED = Path(__file__).with_name("stub_run.json")
SCREENS = 100  # lines: two screens of a laptop's editor or browser
# What a stub's failure carries after its first line in a real run: Hypothesis's note of the input it tried.
EXAMPLE = "\nFailing explicit example: {name}(\n    cases=[(10, 4), (7, 3), (3, 5), (0, 2)],\n)"


def _recorded() -> list[TestOutcome]:
    data = json.loads(RECORDED.read_text())
    tests = []
    for nodeid, points, outcome, message, not_graded in data["tests"]:
        text = data["messages"][message] if isinstance(message, int) else message
        if outcome == "failed":
            text += EXAMPLE.format(name=nodeid.split("::")[-1].partition("[")[0])
        tests.append(TestOutcome(nodeid, points, outcome, text, not_graded))
    return tests


def _feedback(tests: list[TestOutcome], folder: Path, name: str = "stubs") -> str:
    write_feedback(Result(name, "ok", "", tests), folder / f"{name}.md")
    return (folder / f"{name}.md").read_text()


def test_the_whole_courses_stubs_fit_on_two_screens(tmp_path):
    tests = _recorded()
    assert {exercise_of(p.name) for p in TESTS.glob("test_ex*_*.py")} <= {t.exercise for t in tests}, (
        f"{RECORDED.name} misses an exercise: record it again (see this file's docstring)")
    failed = [t for t in tests if t.outcome == "failed"]
    assert failed and all(unwritten(t) is not None for t in failed), "every failure of a stub run is a stub's"
    text = _feedback(tests, tmp_path)
    lines = text.splitlines()
    assert len(lines) <= SCREENS and max(map(len, lines)) <= FEEDBACK_WIDTH, text
    assert "Failing" not in text and "cases=" not in text and "What went wrong" not in text, text
    groups = stub_groups(tests)
    entries = [line for line in text.split(UNWRITTEN_HEADING)[1].splitlines() if line.startswith("* **")]
    assert len(entries) == len(groups) > 0
    for group in groups:  # each stub once, with how many tests stopped there and what they are worth
        entry = f"* **{group.stub.exercise} · `{group.stub.function}`** ({group.counts()})"
        assert sum(line.startswith(entry) for line in entries) == 1, entry
    points = sum(t.possible for t in tests)
    assert f"**0 / {points:g} points**" in text


def test_the_check_table_of_a_stub_shows_each_hint_once_as_the_feedback_does():
    tests = [t for t in _recorded() if t.exercise == "ex05"]
    result = CheckResult("ex05", tests)
    page, text = result._repr_html_(), result.format(width=2000)  # wide: each message on one line
    groups = stub_groups(tests)
    assert len(groups) > 1
    for group in groups:
        message = group.stub.message.removeprefix("ex05: ")
        assert page.count(html.escape(message)) == 1 and text.count(message) == 1, message
    assert "Failing" not in page + text and not result.smallest_failing_inputs()


EX01_WRONG = '''    element = torch.empty((), dtype=dtype).element_size()
    return batch_size * (features + depth * hidden + classes) * element  # the logits too: nothing saves them
'''


@pytest.mark.skipif(not (EXERCISES / "ex01_devices.py").is_file(), reason="no exercises/ex01_devices.py")
def test_a_half_done_exercise_shows_the_wrong_functions_example_and_each_stubs_hint_once(tmp_path, monkeypatch):
    """ex01 with mlp_activation_bytes written wrongly and its three other functions untouched: a real check run."""
    stub = (EXERCISES / "ex01_devices.py").read_text()
    hint = "each Linear saves its input; each ReLU saves its output, which is the next Linear's input"
    line = f"    raise NotImplementedError({hint!r})\n"
    if line not in stub:
        line = line.replace(repr(hint), f'"{hint}"')
    assert line in stub, "exercises/ex01_devices.py is not the untouched stub"
    (tmp_path / "ex01_devices.py").write_text(stub.replace(line, EX01_WRONG))
    monkeypatch.setenv("COURSE_HYPOTHESIS", "quick")  # the explicit examples and two drawn inputs, no shrinking
    result = run_check("ex01", target=str(tmp_path))
    text = _feedback(result.tests, tmp_path, "half_done")
    flat = " ".join(text.split())
    others = [h for h in stub_hints("ex01") if h != hint]
    assert len(others) == 3
    unwritten_part, _, wrong = text.partition("## What went wrong")
    assert UNWRITTEN_HEADING in unwritten_part and wrong
    for other in others:  # started: each stub's whole hint, once (as Markdown shows it: \* is *)
        assert " ".join(unwritten_part.replace("\\", "").split()).count(other) == 1, other
        assert flat.replace("\\", "").count(other) == 1, other
    assert hint not in flat
    assert "### ex01: test_mlp_activation_bytes_matches_what_autograd_saves" in wrong
    assert "sizes=" in wrong and ("Falsifying" in wrong or "Failing" in wrong), wrong  # Hypothesis's input
    examples = sum(text.count(word) for word in ("Falsifying", "Failing"))
    assert examples == sum(wrong.count(word) for word in ("Falsifying", "Failing")), "examples for stubs"
    headings = [line for line in wrong.splitlines() if line.startswith("### ")]
    assert all("mlp_activation_bytes" in h for h in headings), headings
    # check()'s table, from the same run: the same stubs, each hint once; an input shown for the wrong function only
    table = result.format(width=2000)  # wide: each message on one line
    for other in others:
        assert table.count(other) == 1, other
    assert {name.partition("[")[0] for name, _ in result.smallest_failing_inputs()} <= {
        h.removeprefix("### ex01: ").partition("[")[0] for h in headings}
    assert result.smallest_failing_inputs()


# ------------------------------------------------------------------------------------------------ recording


def record(report: Path | None = None) -> None:
    """Run every graded test on the untouched stubs (or read the report of such a run) and write stub_run.json:
    each test's points, outcome, first message line (shared lines once) and why it was not graded."""
    from course_lib.grading.results import read_report

    with tempfile.TemporaryDirectory() as folder:
        if report is None:
            report = Path(folder) / "report.jsonl"
            subprocess.run([sys.executable, "-m", "pytest", *sorted(map(str, TESTS.glob("test_ex*_*.py"))),
                            "--target", "exercises", "--course-report", str(report), "-q", "-p", "no:randomly"],
                           cwd=ROOT)
        done = read_report(report)
    messages: list[str] = []
    tests = []
    for collected in done.collected:
        t = done.tests.get(collected.nodeid)
        if t is None:
            continue
        first = (t.message or "").strip().splitlines()[0] if (t.message or "").strip() else ""
        if t.outcome == "failed":
            if first not in messages:
                messages.append(first)
            first = messages.index(first)
        tests.append([t.nodeid, t.points, t.outcome, first, t.not_graded])
    data = {"about": "every graded test on the untouched stubs: [nodeid, points, outcome, message (its first line, or "
                     "its index in messages), not graded]; written by "
                     "tests/course/instructor/test_feedback.py --record",
            "messages": messages, "tests": tests}
    rows = {key: ",\n".join(json.dumps(row, ensure_ascii=False) for row in data[key]) for key in ("messages", "tests")}
    RECORDED.write_text(f'{{"about": {json.dumps(data["about"])},\n"messages": [\n{rows["messages"]}\n],\n'
                        f'"tests": [\n{rows["tests"]}\n]}}\n')  # a line per test
    print(f"wrote {RECORDED}: {len(tests)} tests, {len(messages)} messages")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--record"]:
        sys.exit(__doc__)
    record(Path(sys.argv[2]) if sys.argv[2:] else None)  # --record [a report of such a run]
