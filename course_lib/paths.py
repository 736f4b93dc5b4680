"""Where the course's folders are: one place, so nothing else works it out again (notebook 00)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository: README.md, course.py, notebooks/ ...
NOTEBOOKS = ROOT / "notebooks"
EXERCISES = ROOT / "exercises"  # the learner's files
SOLUTIONS = ROOT / "solutions"  # the reference solutions (absent from a student release)
TESTS = ROOT / "tests"
