"""Each lesson is executed once per run: where the browser tests run it in JupyterLab, nbclient does not run it again.

tests/course/browser's test_lesson_runs_clean fails on everything test_notebook_runs_on_this_machine_without_errors
fails on (an error output, anything on stderr) and more (a cell that did not run, a widget shown as text). So when
that test is selected for a lesson in the same run, executing the lesson a second time here only costs minutes of CI
(issue 20). With `-m "not browser"`, or where the browser tests cannot run (no playwright or no Chromium: their module
is skipped, so none of its tests is collected), every lesson is executed here as before.
"""

from __future__ import annotations

import pytest

EXECUTED_HERE = "test_notebook_runs_on_this_machine_without_errors"
EXECUTED_IN_BROWSER = "test_lesson_runs_clean"


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    in_browser = {item.callspec.id for item in items
                  if getattr(item, "originalname", "") == EXECUTED_IN_BROWSER and hasattr(item, "callspec")}
    for item in items:
        if getattr(item, "originalname", "") == EXECUTED_HERE and item.callspec.id in in_browser:
            item.add_marker(pytest.mark.skip(
                reason=f"executed once, in JupyterLab, by {EXECUTED_IN_BROWSER}[{item.callspec.id}] in this run"))
