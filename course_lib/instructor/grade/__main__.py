"""`python -m course_lib.instructor.grade` (the same as `python -m course_lib.grade`)."""

import sys

from course_lib.instructor.grade.cli import main

sys.exit(main())
