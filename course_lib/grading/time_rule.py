"""The grader's time limit per test, one rule for the instructor's grader and the learner's `check` (notebook 00).

A test's limit is FACTOR times the reference solution's time on that test, at least FLOOR seconds and at most
CEILING (the grader's --time-factor, --time-floor and --test-timeout defaults; an uncalibrated test gets CEILING).
Once a test of an exercise has run out of time (grading.loops), the exercise's other tests get LOOPED_FLOOR
instead of FLOOR: the floor is there for a loaded machine, and a function that loops too would otherwise cost each
of its tests the whole floor. The factor stays: with half of it, a correct all_reduce_mean graded beside other
work on CI's 2 cores ran out of time after shard_range had looped, and lost its points. FLOOR was 5 s while each rank of ex05-ex08 imported torch._dynamo
in the grader's sandbox (1.4 s a launch, now 0.2 s); 3 s is still over 4 times the reference's time for 70 % of
the tests (their median is 0.47 s), and lets a student whose every function loops be graded in under a minute.
"""

from __future__ import annotations

import re

FACTOR = 4.0
FLOOR = 3.0
CEILING = 120.0
LOOPED_FLOOR = 1.0
# The key, in a --test-timeouts file {nodeid: seconds}, of {nodeid: seconds} after a loop (limits_after_a_loop).
# Every nodeid holds '::', so none can be this key.
AFTER_A_LOOP = "after a loop"
# What pytest-timeout says when a test runs out of its limit (the runner, check and the grader read it).
TIMED_OUT = re.compile(r"Timeout \(>[\d.]+s\) from pytest-timeout")


def calibrated_limits(durations: dict[str, float], factor: float = FACTOR, floor: float = FLOOR,
                      ceiling: float = CEILING) -> dict[str, float]:
    """nodeid -> seconds: `factor` times the reference's duration, at least `floor`, at most `ceiling`."""
    return {nodeid: round(min(max(floor, factor * seconds), ceiling), 1) for nodeid, seconds in durations.items()}


def limits_after_a_loop(durations: dict[str, float], factor: float = FACTOR, ceiling: float = CEILING) -> dict[str, float]:
    """nodeid -> seconds, once a test of the same exercise ran out of time: the rule with LOOPED_FLOOR."""
    return calibrated_limits(durations, factor, LOOPED_FLOOR, ceiling)
