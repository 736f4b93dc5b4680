"""`python -m course_lib.grade SUBMISSIONS --out OUT`: grade a class (the code is in course_lib.instructor.grade)."""

import sys

from course_lib.instructor.grade.cli import main

if __name__ == "__main__":
    sys.exit(main())
