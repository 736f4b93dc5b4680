"""Gradescope's autograder, built from the course's own grader (the instructor's tool).

    python3 course.py grade gradescope --out autograder.zip [--tests HIDDEN_TESTS] [--exercises ex00,ex05]
                                       [--timeout 540] [--memory-gb 4] [--time-factor 4] ...

Builds the zip Gradescope asks for (its "Autograder Specifications": setup.sh and run_autograder at the root,
the rest unpacked to /autograder/source). Inside: the course library, the graded tests of the chosen exercises,
the hidden tests, each test's time limit (calibrated here, now, from the reference solutions, and never again),
the course's pinned requirements (only those grading imports: no JupyterLab, widgets or plots), and
settings/gradescope.json, which says what was built. The reference solutions are not in it: no graded test reads
them. Beside the zip, autograder.time_limits.json (named after --out) holds each test's limit as a table: its
reference time, its limit and how the rule gave it.

On Gradescope, setup.sh runs once when the image is built (apt: Python, bubblewrap; pip: the course's pins, CPU
torch); run_autograder runs once per submission and calls `run` (container.py), which grades /autograder/submission with
the same judge, sandbox and limits as `python3 course.py grade`, and writes /autograder/results/results.json:

* what was submitted: the exercises/ folder's files, the whole course folder, or a zip of either;
* a missing file, a file named differently (ex05_ddp (1).py) or one that does not compile is said at the top of
  results.json's output, and costs the tests of that exercise only;
* hidden tests carry visibility "after_published"; tests that need a GPU show as not graded, with the reason;
* whatever happens, a results.json is written (run_autograder writes one itself if Python cannot start).

AUTOGRADER_ROOT replaces /autograder (for the course's own test of the package, which cannot use /autograder).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from course_lib import stopping
from course_lib.grading import time_rule
from course_lib.instructor.grade.gradescope.container import HIDDEN_VISIBILITY, run
from course_lib.instructor.grade.gradescope.package import BuildOptions, build


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # SIGTERM (run_autograder passes its signals on as SIGTERM) stops the judge and the student's processes, as
    # Ctrl-C does; Ctrl-C works although run_autograder starts this in the background, where SIGINT is ignored.
    stopping.stop_like_ctrl_c()
    if argv[:1] == ["run"]:
        parser = argparse.ArgumentParser(prog="run_autograder", description="grade one Gradescope submission")
        parser.add_argument("run")
        parser.add_argument("--root", type=Path, default=Path(os.environ.get("AUTOGRADER_ROOT", "/autograder")))
        return run(parser.parse_args(argv).root.resolve())
    parser = argparse.ArgumentParser(prog="python3 course.py grade gradescope", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the zip to write (e.g. autograder.zip)")
    parser.add_argument("--tests", type=Path, default=None, help="folder of hidden tests (test_exNN_*.py), shown "
                        f"to students with visibility {HIDDEN_VISIBILITY!r}")
    parser.add_argument("--exercises", default=None, help="only these, e.g. ex00,ex05 (default: every exercise)")
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds for one submission's whole run "
                        "(default 540: under Gradescope's default limit of 10 minutes, so results.json is written)")
    parser.add_argument("--test-timeout", type=float, default=time_rule.CEILING,
                        help=f"the most a calibrated limit may be (default {time_rule.CEILING:g})")
    parser.add_argument("--memory-gb", type=float, default=4.0, help="memory of all of a submission's processes "
                        "(default 4; give Gradescope's container more than this)")
    parser.add_argument("--time-factor", type=float, default=time_rule.FACTOR,
                        help=f"a test's limit is this many times the reference's time here (default {time_rule.FACTOR:g};"
                             " raise it if Gradescope's machine is much slower than this one)")
    parser.add_argument("--time-floor", type=float, default=time_rule.FLOOR,
                        help=f"... and at least this many seconds (default {time_rule.FLOOR:g})")
    parser.add_argument("--cpus", type=float, default=2.0, help="the CPUs you give Gradescope's container in its "
                        "Autograder Settings (default 2; Gradescope's own default is 0.5): with fewer than 3, the "
                        "limits grow, as the tests' ranks take turns")
    parser.add_argument("--recalibrate", action="store_true", help="grade the reference again, not from the cache")
    options = parser.parse_args(argv)
    if options.tests is not None and not options.tests.is_dir():
        parser.error(f"--tests {options.tests} is not a folder")
    if options.out.suffix != ".zip":
        parser.error(f"--out {options.out}: Gradescope takes a .zip file")
    if min(options.timeout, options.test_timeout, options.memory_gb, options.time_factor, options.cpus) <= 0:
        parser.error("--timeout, --test-timeout, --memory-gb, --time-factor and --cpus must be positive")
    exercises = [e.strip() for e in options.exercises.split(",") if e.strip()] if options.exercises else None
    config = build(options.out, BuildOptions(
        hidden=options.tests, exercises=exercises, timeout=options.timeout, test_timeout=options.test_timeout,
        memory_gb=options.memory_gb, time_factor=options.time_factor, time_floor=options.time_floor,
        cpus=options.cpus, use_cache=not options.recalibrate))
    graded = config["graded_tests"]
    peak = config["built"]["reference_memory_peak_gib"]
    peak = f"the reference solutions peaked at {peak:g} GiB here" if peak else "no memory cgroup here to measure it"
    print(f"wrote {options.out}: {', '.join(config['exercises'])}; {len(graded)} graded tests "
          f"({sum('/hidden/' in t for t in graded)} hidden), {config['points_possible_here']:g} points possible on "
          f"this machine; time limits calibrated here in {config['built']['reference_seconds']:g} s.\n"
          f"On Gradescope (the assignment's Configure Autograder page): upload it; in Autograder Settings give the "
          f"container {options.cpus:g} CPUs and at least {max(2.0, options.memory_gb):g} GB of memory ({peak}; "
          "Gradescope's default is 768 MB), and a timeout above --timeout.")
    return 0
