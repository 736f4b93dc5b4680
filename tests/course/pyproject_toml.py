"""pyproject.toml as the course's own tests read it: with tomllib, or on Python 3.10 (which has none) its backport
tomli, from pyproject.toml's test extra. (vermin sees a version guard at a module's top level only: here.)"""

from __future__ import annotations

import sys

from course_lib.paths import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
