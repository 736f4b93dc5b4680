"""How `python3 course.py test` spreads the course's own tests over pytest-xdist workers (`--dist loadscope`).

Each test file is one unit of work (a worker runs all of it, so its module fixtures start once), except the browser
lessons: each lesson is a unit of its own (its tests share one run of the lesson), so lessons run side by side.
The units that take minutes are handed out first, the longest first, so that no worker starts one near the end:
measured on the 2-core CI machine (`pytest --durations`), the whole class of test_grade.py took 250-300 s, the
grader's limits about 200 s, each lesson in the browser 30-130 s, everything else under 40 s a file.

The units are given to xdist by a scheduler of our own (pytest_xdist_make_scheduler below), which reads a test's
unit from its node id. xdist's own `--dist loadgroup` no longer worked: it appends the group to each item's
`_nodeid`, which pytest 9.2 ignores (a node id is now `item._id`), so every test became a unit of its own, and a
module fixture (the graded class, a lesson's run in the browser) ran once on each worker that got one of its tests.
tests/course/setup/test_setup.py runs a small suite under xdist and checks that a unit's tests share a worker.
Without xdist (or with another --dist) only the order changes. Not in the student release (course_lib/instructor/
release.py): it is about the course's own suite.
"""

from __future__ import annotations

import pytest

# Path suffixes of the units that take minutes, longest first (per lesson for the browser lessons' file).
LONG_FIRST = ("instructor/test_grade.py", "instructor/test_grade_limits.py", "instructor/test_gradescope.py",
              "browser/test_lessons_in_browser.py",
              "browser/test_exercise_in_browser.py", "setup/test_stopping.py", "instructor/test_stopping_grader.py",
              "multinode/test_torchrun_multinode.py", "toolkit/test_check.py", "setup/test_setup.py")
PER_LESSON = "browser/test_lessons_in_browser.py"


def unit_of(nodeid: str) -> str:
    """The work unit of a test, from its node id: its file; for the browser lessons' file, its file and lesson
    (the lesson is the test's parameter id, e.g. `...::test_lesson_runs_clean[05_ddp]` -> `...::05_ddp`)."""
    path, _, rest = nodeid.partition("::")
    if path.endswith(PER_LESSON) and rest.endswith("]") and "[" in rest:
        return f"{path}::{rest[rest.index('[') + 1:-1]}"
    return path


def _rank(unit: str) -> int:
    path = unit.split("::")[0]
    return next((i for i, suffix in enumerate(LONG_FIRST) if path.endswith(suffix)), len(LONG_FIRST))


def pytest_collection_modifyitems(config, items):
    first_seen = {}
    for index, item in enumerate(items):
        first_seen.setdefault(unit_of(item.nodeid), index)
    # Stable: the long units first (in LONG_FIRST's order), each unit's tests together, in their own order.
    items.sort(key=lambda item: (_rank(unit_of(item.nodeid)), first_seen[unit_of(item.nodeid)]))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown (and never called) without it
def pytest_xdist_make_scheduler(config, log):
    """With `--dist loadscope`: xdist's scope scheduler, its scopes being the course's units (unit_of). With
    `--no-loadscope-reorder` it hands them out in collection order, which the sort above made longest first."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CourseUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return CourseUnits(config, log)
