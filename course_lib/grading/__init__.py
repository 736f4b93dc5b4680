"""What graded tests use, and how their results are counted (the course's grading machinery).

    from course_lib.grading import run, call, ExerciseFailed, exception_raised_by

runner.py        how a test calls learner code: in a child process or in gloo ranks, plain data back
results.py       TestOutcome (one test's outcome and points), the report file and its one rule for points
plugin.py        the pytest plugin: --target, --course-report, --confine, the points and gpu markers
confinement.py   the grader's limits on processes that run a student's code
simgpu.py        a simulated CUDA device that a test's driver installs in the child, to grade stream code without a GPU
shortcuts.py     torch's and the course's own versions of an exercise, switched off in the child while it is graded
collective_log.py  the collectives a rank starts, logged where every torch.distributed function passes
"""

from course_lib.grading.runner import ExerciseFailed, ExerciseStopped, call, exception_raised_by, exercise_path, run

__all__ = ["run", "call", "ExerciseFailed", "ExerciseStopped", "exception_raised_by", "exercise_path"]
