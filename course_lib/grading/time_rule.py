"""The grader's time limit per test, one rule for the instructor's grader and the learner's `check` (notebook 00).

A test's limit is FACTOR times the reference solution's time on that test, at least FLOOR seconds and at most
CEILING (the grader's --time-factor, --time-floor and --test-timeout defaults; an uncalibrated test gets CEILING).
"""

from __future__ import annotations

FACTOR = 4.0
FLOOR = 5.0
CEILING = 120.0


def calibrated_limits(durations: dict[str, float], factor: float = FACTOR, floor: float = FLOOR,
                      ceiling: float = CEILING) -> dict[str, float]:
    """nodeid -> seconds: `factor` times the reference's duration, at least `floor`, at most `ceiling`."""
    return {nodeid: round(min(max(floor, factor * seconds), ceiling), 1) for nodeid, seconds in durations.items()}
