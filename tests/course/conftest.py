"""How `python3 course.py test` spreads the course's own tests over pytest-xdist workers (`--dist loadgroup`).

Each test file is one unit of work (a worker runs all of it, so its module fixtures start once), except the browser
lessons: each lesson is a unit of its own (its tests share one run of the lesson), so lessons run side by side.
The units that take minutes are handed out first, the longest first, so that no worker starts one near the end:
measured on the 2-core CI machine (`pytest --durations`), the whole class of test_grade.py took 300 s, the
grader's limits about 250 s, each lesson in the browser 50-95 s, everything else under 40 s a file.
Without xdist (or with another --dist) the groups are unused and only the order changes.
"""

from __future__ import annotations

import pytest

# Path suffixes of the units that take minutes, longest first (per lesson for the browser lessons' file).
LONG_FIRST = ("instructor/test_grade.py", "instructor/test_grade_limits.py", "browser/test_lessons_in_browser.py",
              "browser/test_exercise_in_browser.py", "toolkit/test_check.py", "setup/test_setup.py")
PER_LESSON = "browser/test_lessons_in_browser.py"


def unit_of(item: pytest.Item) -> str:
    """The work unit of a test: its file, or its file and lesson for the browser lessons."""
    path = item.nodeid.split("::")[0]
    lesson = getattr(item, "callspec", None) and item.callspec.params.get("lesson")
    if path.endswith(PER_LESSON) and lesson is not None:
        return f"{path}::{getattr(lesson, 'stem', lesson)}"
    return path


def _rank(unit: str) -> int:
    path = unit.split("::")[0]
    return next((i for i, suffix in enumerate(LONG_FIRST) if path.endswith(suffix)), len(LONG_FIRST))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(unit_of(item)))
    first_seen = {}
    for index, item in enumerate(items):
        first_seen.setdefault(unit_of(item), index)
    # Stable: the long units first (in LONG_FIRST's order), each unit's tests together, in their own order.
    items.sort(key=lambda item: (_rank(unit_of(item)), first_seen[unit_of(item)]))
