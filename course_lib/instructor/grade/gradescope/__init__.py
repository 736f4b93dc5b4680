"""Gradescope's autograder, built from the course's own grader (the instructor's tool), one concept a file:

* package.py: building the package (`python3 course.py grade gradescope`): the time limits calibrated from the
  reference solutions, setup.sh, run_autograder, the pinned requirements, and what goes in the zip;
* submission.py: reading a submission inside Gradescope's container (the files found, missing, misnamed, or
  that do not compile);
* container.py: grading it there and writing results.json (`run`, started by run_autograder);
* command.py: the command line (`main`, its --help the whole story); __main__.py runs it.
"""

from course_lib.instructor.grade.gradescope.package import (CONFIG, GRADING_IMPORTS, NOT_FOR_GRADING,
                                                            RUN_AUTOGRADER, TORCH_CPU_INDEX, VENV, BuildOptions,
                                                            _write_zip, build, limits_table_path,
                                                            pinned_requirements, pyproject_dependencies,
                                                            requirement_name, setup_script, usable_cores)
from course_lib.instructor.grade.gradescope.submission import (EXERCISE_NAME, MAX_LISTED, Submission,
                                                               read_submission)
from course_lib.instructor.grade.gradescope.container import (HIDDEN_VISIBILITY, close_to_students, run,
                                                              student_summary)
from course_lib.instructor.grade.gradescope.command import main

__all__ = ["CONFIG", "HIDDEN_VISIBILITY", "TORCH_CPU_INDEX", "VENV", "EXERCISE_NAME", "MAX_LISTED",
           "NOT_FOR_GRADING", "GRADING_IMPORTS", "RUN_AUTOGRADER", "requirement_name", "pyproject_dependencies",
           "pinned_requirements", "setup_script", "BuildOptions", "build", "limits_table_path", "usable_cores",
           "Submission", "read_submission", "close_to_students", "run", "student_summary", "main"]
