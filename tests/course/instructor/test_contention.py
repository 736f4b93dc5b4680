"""The grader's time limits grow with the judges that share the cores (time_limits.contention)."""

from __future__ import annotations

import pytest

from course_lib.instructor.grade.time_limits import contention


@pytest.mark.parametrize("jobs, cores, want", [
    (1, 1, 1.0), (1, 2, 1.0), (1, 16, 1.0),  # one judge: the reference's own conditions
    (2, 2, 2.0), (3, 2, 3.0), (4, 2, 4.0),  # the course's 2-core machine: each judge's ranks get 1 core of 2
    (2, 4, 1.0), (3, 4, 1.5), (8, 16, 1.0), (16, 16, 2.0),
    (2, 1, 2.0), (5, 1, 5.0),  # one core: judges take turns
])
def test_contention_counts_two_busy_cores_per_judge(jobs, cores, want):
    assert contention(jobs, cores) == pytest.approx(want)
