"""What runs inside Gradescope's container for each submission: grade it, and write results.json (the
instructor's tool; started by the package's run_autograder as `python -m course_lib.instructor.grade.gradescope
run`).

`run` grades /autograder/submission with the same judge, sandbox and limits as `python3 course.py grade`, with
the time limits calibrated when the package was built (package.py), and writes /autograder/results/results.json
whatever happens; `student_summary` is what its top tells the student.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

from course_lib.grading import time_rule
from course_lib.instructor.grade.gradescope.package import CONFIG
from course_lib.instructor.grade.gradescope.submission import read_submission

HIDDEN_VISIBILITY = "after_published"


def close_to_students(source: Path, results: Path) -> None:
    """Where no sandbox can be made, file permissions are what is left: the tests (hidden ones included), the
    package's settings and the results folder are the grader's alone (student code runs as another user)."""
    for folder in (source / "tests", (source / CONFIG).parent):
        for path in [folder, *folder.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o700 if path.is_dir() else 0o600)
    results.mkdir(parents=True, exist_ok=True)
    results.chmod(0o755)


def run(root: Path) -> int:
    """Grade root/submission with the package in root/source; write root/results/results.json. Never raises."""
    started = time.monotonic()
    results = root / "results" / "results.json"
    try:
        results.parent.mkdir(parents=True, exist_ok=True)
        results.unlink(missing_ok=True)
        data = _grade(root, started)
    except BaseException as error:  # noqa: BLE001 - whatever happens, Gradescope gets a results.json
        traceback.print_exc()
        why = ("it was stopped before it finished (SIGTERM or Ctrl-C), not by your code"
               if isinstance(error, KeyboardInterrupt) else
               f"an error in the grader, not in your code ({type(error).__name__})")
        data = {"score": 0.0, "execution_time": round(time.monotonic() - started),
                "output": f"The autograder could not grade this submission: {why}. Your instructor can see the "
                          "details in its output.",
                "visibility": "visible", "stdout_visibility": "hidden", "tests": []}
    partial = results.with_name("results.json.part")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(results)  # whole or not at all: student code can neither read nor write this folder
    print(f"results.json: {data['score']:g} points; {len(data.get('tests', []))} tests; "
          f"{time.monotonic() - started:.1f} s", flush=True)
    return 0


def _grade(root: Path, started: float) -> dict:
    from course_lib.instructor.grade.classroom import GradeOptions, prepare_settings
    from course_lib.instructor.grade.report import results_json
    from course_lib.instructor.grade.sandbox import detect_isolation
    from course_lib.instructor.grade.student import grade_files
    from course_lib.instructor.grade.users import UidClaim

    source, results = root / "source", root / "results"
    config = json.loads((source / CONFIG).read_text())
    submission = read_submission(root / "submission", config["exercise_files"])
    for line in submission.problems:
        print(f"submission: {line}", flush=True)
    if config.get("hypothesis_profile"):
        os.environ["COURSE_HYPOTHESIS"] = config["hypothesis_profile"]
    # weak isolation is graded all the same: the container holds no solutions (COURSE_GRADE_ISOLATION forces one)
    isolation = detect_isolation(os.environ.get("COURSE_GRADE_ISOLATION", "auto"))
    if isolation.mode != "bwrap":
        close_to_students(source, results)
    hidden = source / "tests" / "hidden"
    work = Path(tempfile.mkdtemp(prefix="course-gradescope-"))
    os.chmod(work, 0o711)
    claim = None
    try:
        options = GradeOptions(jobs=1, timeout=config["timeout"], test_timeout=config["test_timeout"],
                               hidden=hidden if hidden.is_dir() else None, exercises=config["exercises"],
                               memory_gb=config["memory_gb"], progress=False)
        s = prepare_settings(work / "out", work, root / "submission", options, isolation)
        s.hide = [p for p in [*s.hide, results, source / "tests", (source / CONFIG).parent] if p.exists()]
        s.time_limits = work / "time-limits.json"
        s.time_limits.write_text(json.dumps({**config["time_limits"],
                                             time_rule.AFTER_A_LOOP: config.get("time_limits_after_a_loop", {})}))
        os.chmod(s.time_limits, 0o644)
        s.limit_note = config["limit_note"]
        claim = UidClaim(1) if s.isolation.users else None
        result = grade_files("submission", submission.files, submission.found_in, 1, claim.uids[0] if claim else None,
                             s)
        log = (work / "out" / "submission" / "grading.log")
        if log.exists():  # the judge's own output: Gradescope shows stdout to the instructor only
            print(log.read_text(errors="replace")[-20000:], flush=True)
        return results_json(result, hidden_visibility=HIDDEN_VISIBILITY, preamble=submission.problems,
                            epilogue=student_summary(result), execution_time=time.monotonic() - started)
    finally:
        if claim is not None:
            claim.release()
        shutil.rmtree(work, ignore_errors=True)


def student_summary(result) -> list[str]:
    """What the top of results.json tells the student besides the status: points per exercise on the visible tests
    (not the hidden ones: with visibility after_published, Gradescope hides the total until the grades are
    published), whether hidden tests exist, the functions still untouched stubs, and the tests that need a GPU."""
    from course_lib.grading.results import stub_groups
    from course_lib.tables import plural

    visible = [t for t in result.tests if not t.hidden]
    exercises = sorted({t.exercise for t in visible})
    points = [(e, sum(t.earned for t in visible if t.exercise == e), sum(t.possible for t in visible if t.exercise == e))
              for e in exercises]
    lines = ["Visible tests: " + ", ".join(f"{e} {got:g} / {possible:g} points" for e, got, possible in points) + "."
             ] if points else []
    hidden = [t for t in result.tests if t.hidden]
    if hidden:
        lines.append(f"Hidden tests: {plural(len(hidden), 'test')}, whose results appear when your instructor "
                     "publishes the grades.")
    groups = stub_groups(visible)
    if groups:  # the functions still to write, each once, where the tests' outputs say it test by test
        lines.append("Not implemented yet (every test that reaches one fails at once; its output gives the hint): "
                     + "; ".join(f"{g.stub.name} ({g.counts()})" for g in groups) + ".")
    needs_gpu = [t for t in visible if t.status == "not graded"]
    if needs_gpu:
        lines.append(f"Not graded here: {plural(len(needs_gpu), 'test')} needing a GPU, which Gradescope's machines "
                     "lack; they count in neither your points nor the points possible.")
    return lines
