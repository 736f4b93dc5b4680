"""Grade a whole class: one row per student, safely and in bounded time (the instructor's tool).

    python3 course.py grade SUBMISSIONS --out OUT [--jobs N] [--timeout SECONDS]      (python -m course_lib.grade)
                            [--test-timeout SECONDS] [--tests HIDDEN_TESTS_DIR] [--exercises ex00,ex01]
                            [--memory-gb 4] [--address-space-gb 6] [--no-calibration] ... (see --help)
    python3 course.py grade gradescope --out autograder.zip [--tests HIDDEN_TESTS_DIR] [--exercises ex00,ex05]
                            the same grader as Gradescope's autograder (gradescope/)

Each entry of SUBMISSIONS (a folder or a .zip) is one student's copy of exercises/, or of a whole
course folder that contains one. Writes OUT/grades.csv (one row per student: points per exercise, the
isolation that graded it, files opened outside the allow-list), OUT/summary.md and OUT/summary.csv (the
class: statuses, points per exercise, each test's pass rate), and for each student
OUT/<student>/results.json (Gradescope's schema), OUT/<student>/feedback.md and OUT/<student>/grading.log.
Without bubblewrap it refuses to grade unless given --allow-weak-isolation.

How a student is graded (what is bounded where: the README's instructor section):

* Only the student's exNN_*.py files are copied, as plain files (no links), into a scratch folder;
  a submitted conftest.py, pytest.ini, tests/ or solutions/ is never looked at.
* A *judge* pytest process runs the course's own tests (and a copy of the hidden tests) with a
  trusted configuration, `--target <scratch>/exercises`. It never imports the student's code: the
  tests reach it through course_lib.grading.runner, in ranks forked from a fork server that runs in
  the student's sandbox (bubblewrap): an allow-list of the filesystem (Python, its packages, the
  course library, the scratch folder, a private /tmp), no network but loopback, its own pids, and,
  as root, a user of its own. The judge, its report, the tests and every other file of the machine
  are not there. Without bubblewrap (and --allow-weak-isolation) the judge runs in a mount namespace
  that hides only the known secrets, and the grader says so. Either way an audit hook in every student
  process records the files it opens outside the allow-list, for summary.md.
* Memory: all of a student's processes together (a memory cgroup, or a watchdog), and each process's
  address space where there is no CUDA. Results cross only as plain data (torch.load(weights_only=True));
  the judge writes its verdicts to a report only the grader reads, line by line, so a judge killed at
  the time limit still counts the tests it finished.
* Time: each test gets a few times the reference solution's duration (graded once, cached), and every
  student a limit for the whole run (--timeout): then the judge and its sandbox are killed.
"""

from course_lib.instructor.grade.classroom import grade_class
from course_lib.instructor.grade.cli import main

__all__ = ["grade_class", "main"]

# Inside: sandbox.py (what this machine can isolate, said aloud), bwrap.py (the allow-list sandbox),
# mount_namespace.py (the fallback), memory_cgroup.py, users.py (a user per student), time_limits.py
# (calibrated per-test limits), submissions.py (reading a student's files), judge.py (the trusted pytest
# process), student.py (one student's grading), report.py (results.json, feedback, the gradebook),
# classroom.py (the whole class), cli.py (the command line).
