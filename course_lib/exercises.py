"""`python -m course_lib.exercises`: write exercises/ from solutions/ (the code is in course_lib.instructor.exercises)."""

import sys

from course_lib.instructor.exercises import main

if __name__ == "__main__":
    sys.exit(main())
