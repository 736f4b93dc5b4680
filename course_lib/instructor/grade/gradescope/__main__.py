"""`python -m course_lib.instructor.grade.gradescope`: the command of command.py (`run` is what run_autograder
calls inside Gradescope's container; otherwise it builds the package)."""

import sys

from course_lib.instructor.grade.gradescope.command import main

sys.exit(main())
