"""Grade a whole class: one row per student, safely and in bounded time (the instructor's tool).

    python -m course_lib.grade SUBMISSIONS --out OUT [--jobs N] [--timeout SECONDS]
                               [--test-timeout SECONDS] [--tests HIDDEN_TESTS_DIR] [--exercises ex00,ex01]

Each entry of SUBMISSIONS (a folder or a .zip) is one student's copy of exercises/, or of a whole
course folder that contains one. Writes OUT/grades.csv (one row per student), and for each student
OUT/<student>/results.json (Gradescope's schema), OUT/<student>/feedback.md and OUT/<student>/grading.log.

How a student is graded (the threat model is in the README's instructor section):

* Only the student's exNN_*.py files are copied, as plain files (no links), into a scratch folder;
  a submitted conftest.py, pytest.ini, tests/ or solutions/ is never looked at.
* A *judge* pytest process runs the course's own tests (and a copy of the hidden tests) with a
  trusted configuration, `--target <scratch>/exercises`. It never imports the student's code: the
  tests reach it through course_lib.grading.runner, in child processes that get resource limits (address
  space, processes, file size) and, when the grader runs as root, switch to a user of their own,
  so they can read neither the solutions, the hidden tests, the other students' files nor the
  judge's report, and can write nowhere but their scratch folder. Where a mount namespace can be
  made, the solutions, the submissions, the hidden tests and OUT are also hidden behind empty mounts.
* Results cross from the student's processes only as plain data (torch.load(weights_only=True)).
  The judge writes its verdicts to a JSON report in a folder only it can write; this process reads
  only that report (and a line-per-test stream, so a judge killed at the time limit still counts
  the tests it finished).
* Every test has a time limit (--test-timeout), and every student one for the whole run (--timeout):
  then the judge's whole session is killed, and (as root) every process of the student's user.
"""

from course_lib.instructor.grade.classroom import grade_class
from course_lib.instructor.grade.cli import main

__all__ = ["grade_class", "main"]

# Inside: sandbox.py (what this machine can isolate), submissions.py (reading a student's files),
# judge.py (the trusted pytest process), student.py (one student's grading), report.py (results.json,
# feedback, the gradebook), classroom.py (the whole class), cli.py (the command line).
