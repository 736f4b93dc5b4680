"""The course's pytest plugin: which folder is graded, points, GPU needs, and the report (notebook 00).

    pytest --target exercises     grade the learner's files (the default)
    pytest --target solutions     grade the reference solutions (CI)
    pytest --target PATH          grade any folder of exNN_*.py files (the instructor's grader)
    pytest --course-report F      write each test's outcome and points to F as they finish (JSON lines)
    pytest --confine F            (the grader) confine the processes that run learner code, as F says
    pytest --test-timeouts F      (the grader, check) a time limit per test, JSON {nodeid: seconds}

pyproject.toml loads it with `-p course_lib.grading.plugin`; the grader's judge loads it the same way.
Graded tests never import the graded files: they reach them through course_lib.grading.runner.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import re
import sys
from pathlib import Path

import pytest

from course_lib import paths, stopping
from course_lib.grading import loops, time_rule
from course_lib.grading.confinement import Confinement
from course_lib.grading.fork_server import start_graders_fork_server
from course_lib.grading.results import TestOutcome, append_record, exercise_of

MARKERS = [
    "points(n): a graded test worth n points",
    "gpu(n): needs n CUDA GPUs; skipped with the reason, and not graded, where they are missing",
    "browser: runs the lessons in JupyterLab in headless Chromium (tests/course/browser); -m 'not browser' skips them",
]


PROFILE_VARIABLE = "COURSE_HYPOTHESIS"  # which Hypothesis profile graded tests use (course_lib.grading.properties)


def load_hypothesis_profile() -> str:
    """Register the course's Hypothesis profiles and load the one $COURSE_HYPOTHESIS names ('grading' if unset).

    grading: derandomized (the same inputs every run, so a grade never changes between runs), no deadline
    (child processes take what they take on a loaded machine), no example database (nothing written beside
    the learner's files), shrinking on (the learner sees the smallest failing case).
    selfcheck: the same, without shrinking (a wrong answer only has to lose points; each shrink step is one
    more child process). quick: selfcheck with two drawn inputs per test besides its explicit examples.
    """
    import tempfile

    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.configuration import set_hypothesis_home_dir

    # Hypothesis caches constants and unicode tables in ./.hypothesis even without an example database: keep
    # them out of the learner's folder and the grader's read-only copies (HYPOTHESIS_STORAGE_DIRECTORY wins).
    set_hypothesis_home_dir(os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
                            or os.path.join(tempfile.gettempdir(), f"course-hypothesis-{os.getuid()}"))

    common = dict(deadline=None, database=None, derandomize=True, print_blob=False, max_examples=10,
                  report_multiple_bugs=False,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture])
    settings.register_profile("grading", **common)
    settings.register_profile("selfcheck", phases=[Phase.explicit, Phase.reuse, Phase.generate], **common)
    # quick: each test's explicit examples and two drawn inputs, no shrinking. For runs that test something else
    # than the exercises (the grader's own tests grade a class on ex00 many times over), or a large class graded
    # in a hurry (the grader passes COURSE_HYPOTHESIS to its judges); the exercises' full runs use 'grading'.
    settings.register_profile("quick", phases=[Phase.explicit, Phase.reuse, Phase.generate],
                              **{**common, "max_examples": 2})
    name = os.environ.get(PROFILE_VARIABLE) or "grading"
    settings.load_profile(name)
    return name


def pytest_addoption(parser):
    group = parser.getgroup("course")
    group.addoption("--target", default="exercises",
                    help="what to grade: 'exercises' (default), 'solutions', or a folder of exNN_*.py files")
    group.addoption("--course-report", default=None, help="write outcomes and points to this file (JSON lines)")
    group.addoption("--confine", default=None, help="(the grader) JSON file of the confinement for learner code")
    group.addoption("--test-timeouts", default=None, help="(the grader, check) JSON file of a time limit per test")
    group.addoption("--exit-fast", action="store_true",
                    help="(check, the grader) once pytest has written everything, leave without the interpreter's "
                         "teardown of torch's modules (1-2 s of a core)")


def _target_folder(config) -> Path:
    target = config.getoption("--target")
    folder = paths.ROOT / target if target in {"exercises", "solutions"} else Path(target).resolve()
    if not folder.is_dir():
        raise pytest.UsageError(f"--target {target}: no such folder ({folder})")
    return folder


def pytest_configure(config):
    # SIGTERM stops pytest as Ctrl-C does: the tests' `finally` blocks and fixtures stop the ranks, servers, browsers
    # and judges they started (SIGTERM's default would end this process at once and leave them running). And where
    # the process that started this pytest asked (check, the grader's judges), it dies with that process.
    config.course_signals = _stop_like_ctrl_c(config)
    stopping.die_with_parent_if_asked()
    if config.getoption("--exit-fast"):
        atexit.register(_exit_now, config)  # now, before torch's and multiprocessing's: it runs after theirs
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    load_hypothesis_profile()
    loops.reset()
    folder = _target_folder(config)
    os.environ["COURSE_TARGET"] = str(folder)  # check() and the notebooks' own children find it here too
    config.course_target = folder
    config.course_results = {}
    config.course_report = config.getoption("--course-report")
    if config.course_report:
        Path(config.course_report).write_text("")
    confinement = Confinement.from_file(config.getoption("--confine")) if config.getoption("--confine") else None
    if _timed(config) and not config.getoption("numprocesses", None):  # an xdist controller runs no test itself
        # Before this process imports torch (the runner does): the fork server imports it, and what the ranks need,
        # on another core while this process imports it, the conftest files and the tests (check("ex08"), 2 cores:
        # its first test starts 1.4 s sooner than when the runner came first).
        start_graders_fork_server(confinement)
    if confinement is not None:
        from course_lib.grading.runner import confine_learner_code

        confine_learner_code(confinement)


def _stop_like_ctrl_c(config) -> dict:
    """SIGTERM as Ctrl-C. Under pytest-xdist, the controller passes SIGINT and SIGTERM on to what runs below it in
    its process group, as a terminal's Ctrl-C reaches it (its workers, their fork servers): a signal to the controller
    alone would leave the workers in their tests until xdist SIGKILLs them 10 s later, with whatever they started.
    A worker takes the first of the two it gets when the whole group was signalled (by course.py, or a terminal)."""
    if hasattr(config, "workerinput"):
        return stopping.stop_like_ctrl_c(stopping.interrupt_once, sigint=True)
    if config.getoption("numprocesses", None):
        return stopping.stop_like_ctrl_c(stopping.interrupt_children, sigint=True)
    return stopping.stop_like_ctrl_c()


@pytest.fixture
def target(request) -> Path:
    """The folder being graded."""
    return request.config.course_target


def pytest_collection_modifyitems(config, items):
    from course_lib.devices import cuda_gpu_count

    gpus = None
    for item in items:
        points = item.get_closest_marker("points")
        item.user_properties.append(("points", points.args[0] if points else None))
        needs = item.get_closest_marker("gpu")
        if needs:
            gpus = cuda_gpu_count() if gpus is None else gpus
            wanted = needs.args[0] if needs.args else 1
            if gpus < wanted:
                reason = f"needs {wanted} CUDA GPU{'s' if wanted > 1 else ''}; this machine has {gpus}"
                item.add_marker(pytest.mark.skip(reason=reason))
                item.user_properties.append(("not_graded", reason))
    if config.getoption("--test-timeouts"):
        limits = json.loads(Path(config.getoption("--test-timeouts")).read_text())
        config.course_limits_after_a_loop = limits.pop(time_rule.AFTER_A_LOOP, {})
        _apply_time_limits(items, limits)


def _apply_time_limits(items, limits: dict[str, float]) -> None:
    """A pytest-timeout marker per test the grader calibrated (see course_lib.instructor.grade.time_limits).

    pytest-timeout's signal method raises in the judge's main thread, inside the launcher's wait, whose
    `finally` kills every rank: student code that ignores signals or sits in C changes nothing. The limit is the
    test function's own (func_only), where the learner's code runs: a limit reached in a fixture's teardown failed
    that test after its call had passed, and left pytest's setup state broken, so that the next test failed too
    ("previous item was not torn down properly": a correct student lost 5 points so, in 1 of 3 gradings of
    benchmarks/grade_class.py's class).
    """
    for item in items:
        if item.nodeid in limits:
            item.add_marker(pytest.mark.timeout(limits[item.nodeid], func_only=True))


def _exercise(item) -> str:
    """'ex05' for a test in test_ex05_*.py (by its file: a nodeid outside the root directory has no path)."""
    return exercise_of(getattr(item, "path", None).name if getattr(item, "path", None) else item.nodeid)


def _time_limit(item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
    try:
        return float(item.config.getini("timeout") or 0)
    except (ValueError, TypeError):
        return 0.0


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item):
    """Before pytest-timeout reads a test's limit: after a loop in its exercise, the shorter one (grading.loops)."""
    exercise = _exercise(item)
    shorter = getattr(item.config, "course_limits_after_a_loop", {}).get(item.nodeid)
    if loops.loops_of(exercise) and shorter and shorter < (_time_limit(item) or float("inf")):
        item.add_marker(pytest.mark.timeout(shorter, func_only=True), append=False)
    loops.start_test(item.nodeid, _time_limit(item))
    looped = len(loops.loops_of(exercise))
    yield
    if len(loops.loops_of(exercise)) > looped and item.config.course_report:
        append_record(item.config.course_report, {"looped": loops.summary()})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    """The ranks a graded test's runs start serve the further runs of the same shape, this test's, its exercise's and
    the next exercises' (course_lib.dist.warm). Where the runner is loaded, that is, in a graded test. Outside
    pytest-timeout's limit of the call (tryfirst: the outer wrapper)."""
    warm = sys.modules.get("course_lib.dist.warm")
    with warm.ranks_kept(None if _exercise(item) == "other" else warm.GRADED) if warm else contextlib.nullcontext():
        yield


def pytest_runtest_setup(item):
    stopped = loops.stopped_message(_exercise(item))
    if stopped:
        from course_lib.grading.runner import ExerciseStopped

        raise ExerciseStopped(stopped)


def pytest_collection_finish(session):
    path = session.config.course_report
    if path:
        collected = []
        for item in session.items:
            properties = dict(item.user_properties)
            collected.append(TestOutcome(item.nodeid, properties.get("points"), "collected",
                                         not_graded=properties.get("not_graded")).to_dict())
        append_record(path, {"collected": collected})
    if _timed(session.config) and session.items:
        from course_lib.grading.runner import warm_up_confined_ranks

        gc.freeze()  # what is loaded stays; full collections 10 x rarer (9 exercises' tests: 1.6 s of them, now 0.6 s)
        gc.set_threshold(*gc.get_threshold()[:2], 100)
        # A sandbox that cannot start fails the judge here, loudly; and no test's time limit (the grader's, or
        # check()'s, which has the grader's) pays for the fork server's start or a first process group.
        warm_up_confined_ranks(session.config.course_target)


_TIMED_OUT = re.compile(r"Timeout \(>[\d.]+s\) from pytest-timeout\.?")


def _short(report) -> str:
    if report.passed:
        return ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2].removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    stopped = _TIMED_OUT.search(str(report.longrepr))
    if stopped and not _TIMED_OUT.search(text):  # Hypothesis wraps it: "_WrappedBaseException() [... FlakyFailure]"
        text = f"Failed: {stopped.group(0)}"
    for prefix in ("course_lib.grading.runner.ExerciseFailed: ", "course_lib.grading.runner.ExerciseStopped: ",
                   "AssertionError: "):
        text = text.removeprefix(prefix)
    return text.strip()


def pytest_runtest_logreport(report):
    results = _config.course_results if _config is not None else None
    if results is None:
        return
    entry = results.get(report.nodeid)
    if entry is None:  # the setup phase: passed, skipped or failed
        properties = dict(report.user_properties)
        results[report.nodeid] = TestOutcome(report.nodeid, properties.get("points"), report.outcome,
                                             _short(report), properties.get("not_graded"), report.duration)
    elif report.when == "call" or (report.failed and entry.outcome != "failed"):
        entry.outcome, entry.message = report.outcome, _short(report)
        entry.duration += report.duration
    else:
        entry.duration += report.duration


def pytest_runtest_logstart(nodeid, location):
    if _config is not None and _config.course_report:
        append_record(_config.course_report, {"started": nodeid})  # check() shows which test runs, and for how long


def pytest_runtest_logfinish(nodeid, location):
    entry = _config.course_results.get(nodeid) if _config is not None else None
    if entry is not None and _config.course_report:
        entry.duration = round(entry.duration, 3)
        append_record(_config.course_report, {"test": entry.to_dict()})


_config = None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    global _config
    _config = session.config


def _timed(config) -> bool:
    return bool(config.getoption("--confine") or config.getoption("--test-timeouts")) and not config.getoption(
        "--collect-only")


def pytest_sessionfinish(session, exitstatus):
    warm = sys.modules.get("course_lib.dist.warm")
    if warm is not None:
        warm.release_all()  # the ranks the last exercise's tests kept
    if session.config.getoption("--confine"):
        from course_lib.grading import runner

        guard = runner._memory_guard
        if guard is not None and guard.watchdog is not None:
            guard.stop()
            kills = ", ".join(f"{size / 2**30:.2f} GiB" for _, _, size in guard.watchdog.kills) or "none"
            print(f"\n[grader] memory watchdog: peak {guard.watchdog.peak / 2**30:.2f} GiB of "
                  f"{guard.limit / 2**30:g} GiB; processes killed: {kills}", flush=True)
    if session.config.course_report:
        append_record(session.config.course_report, {"exitstatus": int(exitstatus)})
    session.config.course_exitstatus = int(exitstatus)


def _exit_now(config) -> None:
    """The last of the exit handlers (--exit-fast): flush what is written and leave with pytest's exit status,
    without the interpreter's teardown of every module, 1-2 s of a core once torch is loaded (measured: 1.0 s
    after the last exit handler, no system call in it, with the fork server's modules loaded; 0.6 s for torch
    alone). Only once pytest's session has finished (Ctrl-C too: its `finally` blocks have run by then); a pytest
    that never got that far leaves as usual."""
    status = getattr(config, "course_exitstatus", None)
    if status is None:
        return
    import logging
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(status)


def pytest_unconfigure(config):
    stopping.restore(getattr(config, "course_signals", {}))  # pytest.main() run in-process: its caller's handlers
