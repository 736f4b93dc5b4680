"""After the browser tests: seconds per notebook, and where the screenshots are."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter, config):
    runs = getattr(config, "course_browser_runs", None)
    if not runs:
        return
    terminalreporter.section("lessons in the browser")
    for name, run in runs.items():
        phases = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in run.phases.items())
        terminalreporter.write_line(f"{name}: {run.seconds:.1f} s ({phases})")
    total = sum(run.seconds for run in runs.values())
    terminalreporter.write_line(f"all {len(runs)} lessons: {total:.1f} s; screenshots: "
                                f"{next(iter(runs.values())).screenshot.parent}/")
