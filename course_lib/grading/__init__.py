"""What graded tests use, and how their results are counted (the course's grading machinery).

    from course_lib.grading import run, call, ExerciseFailed, exception_raised_by

runner.py        how a test calls learner code: in a child process or in gloo ranks, plain data back
results.py       TestOutcome (one test's outcome and points), the report file and its one rule for points
plugin.py        the pytest plugin: --target, --course-report, --confine, the points and gpu markers
confinement.py   the grader's limits on processes that run a student's code
simgpu/          a simulated CUDA device that a test's driver installs in the child, to grade stream code without a GPU
shortcuts.py     torch's and the course's own versions of an exercise, switched off in the child while it is graded
collective_log.py  the collectives a rank starts, logged where every torch.distributed function passes
loops.py         a function that ran out of time costs its own tests: later calls fail at once
time_rule.py     each test's time limit from the reference solution's time
audits.py        checks graded tests of several exercises make on what the learner's code gave back
"""

import sys

__all__ = ["run", "call", "ExerciseFailed", "ExerciseStopped", "exception_raised_by", "exercise_path"]

# What graded runs' pytest (check, the grader's judges) gets in its environment, and the plugins it loads by name:
# - PYTEST_DISABLE_PLUGIN_AUTOLOAD: pytest rewrites the asserts of every module of each plugin it finds installed
#   (anyio, hypothesis, platformdirs, xdist: 120 modules) and, with PYTHONDONTWRITEBYTECODE (the judges'), does it
#   again in every run: 0.8 s of a core, measured on `pytest tests/test_ex08_sharding.py --collect-only` (3.5 s
#   against 2.8 s);
# - OMP_WAIT_POLICY=PASSIVE: torch's OpenMP threads sleep as soon as a parallel region ends, instead of spinning for
#   the next one on cores the ranks need (a rank of world size 1 spun 0.9 s of a core in one judge, seen with perf).
# And without pytest's unraisableexception plugin, whose two full garbage collections at the session's end took
# 0.2-0.5 s of each judge (cProfile), to warn of exceptions nobody could catch: nothing a grade depends on.
GRADED_RUN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "OMP_WAIT_POLICY": "PASSIVE"}
# check() adds this: its gloo ranks, the only graded ones on the machine, keep to a core each where they have a thread
# each (course_lib.dist.sharing_cores.keep_to_one_core; check("ex08") 9.2-9.4 s -> 8.2-9.0 s on 2 cores). Judges,
# two at a time on those cores, leave the scheduler free to move them.
ONE_CORE_PER_RANK = "COURSE_ONE_CORE_PER_RANK"
PLUGIN_OPTIONS = ("-p", "_hypothesis_pytestplugin", "-p", "pytest_timeout", "-p", "no:unraisableexception")

if "pytest" in sys.modules:  # the shared checks' asserts explain a failure as a test's own asserts do
    sys.modules["pytest"].register_assert_rewrite("course_lib.grading.audits")


def __getattr__(name: str):
    """The runner's names, imported on first use: `check` reads results and time_rule without importing torch."""
    if name in __all__:
        from course_lib.grading import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
