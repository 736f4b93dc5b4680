"""The small library behind the course's notebooks, exercises and tests.

Import what a lesson needs from its module, e.g. `from course_lib.dist import launch`.
This package imports nothing heavy itself, so `python -m course_lib.grade` and the
set-up script start fast.
"""

__version__ = "0.1.0"
