"""course_lib.grading.shortcuts: a lesson's own modules refuse to run in a graded child, also where a lesson's module
is a package whose files define the functions (course_lib.parallel.pipeline) and whichever path a learner imports
them by. Run in a fresh interpreter: switching off replaces functions in the modules for the rest of the process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from course_lib.paths import ROOT

CHILD = textwrap.dedent("""
    import sys, types
    from course_lib.parallel.pipeline.schedules import simulate as imported_early   # before the switch
    import course_lib.parallel.pipeline as pipeline
    from course_lib.grading.shortcuts import lesson_module_switch, refuser_for, switch_off_shortcuts

    learner = types.ModuleType("learner")
    learner.simulate = imported_early
    refuser = refuser_for("07", "write it yourself")
    allowed = ("links", "ddp", "ddp_pictures")
    switch_off_shortcuts(learner, lambda name: lesson_module_switch(name, allowed, refuser), refuser)

    import course_lib.parallel.pipeline.stages as stages
    import course_lib.parallel.tensor_parallel as tensor_parallel   # imported after the switch
    import course_lib.parallel.ddp as ddp

    def refuses(call):
        try:
            call()
        except RuntimeError as error:
            return "switched off while exercise 07 is graded" in str(error)
        except Exception:
            return False
        return False

    checks = {
        "the package's name": refuses(lambda: pipeline.simulate("gpipe", 2, 2)),
        "the file's name": refuses(lambda: pipeline.schedules.simulate("gpipe", 2, 2)),
        "a name the learner imported before": refuses(lambda: learner.simulate("gpipe", 2, 2)),
        "a class": refuses(lambda: pipeline.Op(0, "F", 0, 0, 0.0, 1.0)),
        "another file of the package": refuses(lambda: stages.stage_costs(None, None)),
        "a module imported afterwards": refuses(lambda: tensor_parallel.tp_comm_volume(1, 1, 1, 2)),
    }
    still_runs = ddp.all_reduce_time(1e6, 2, next(iter(ddp.LINKS.values()))) > 0
    print(checks, still_runs)
    sys.exit(0 if all(checks.values()) and still_runs else 1)
""")


def test_a_lessons_package_refuses_by_every_path_and_allowed_modules_still_run():
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
