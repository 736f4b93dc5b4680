"""What the course's own tests need from the system rather than from pip (the README's set-up, before notebook 00):
Chromium for the browser tests, bubblewrap and shellcheck for the grader's; apt-get installs them where it can (root,
Debian), and otherwise it is said which tests are skipped. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from course_lib.setup import say

# Where the browser tests look for Chromium (tests/course/browser_lab.py): Debian's binary first.
CHROMIUM = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")
# Commands the course's own tests need from the system, and the Debian package of each.
# bwrap: the grader's sandbox; shellcheck: checks the Gradescope package's scripts. Without them, the tests that need
# them are skipped, with the reason.
SYSTEM_PACKAGES = {"bwrap": "bubblewrap", "shellcheck": "shellcheck"}


def chromium() -> str | None:
    for candidate in CHROMIUM:
        found = candidate if os.access(candidate, os.X_OK) else shutil.which(candidate)
        if found:
            return found
    return None


def can_apt_get() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get") is not None


def apt_get_install(packages: list[str]) -> bool:
    """apt-get install Debian packages (root only), updating the package lists once if the first try fails."""
    quiet = {"stdout": subprocess.DEVNULL, "env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}}
    command = ["apt-get", "install", "-y", "-q", *packages]
    if subprocess.run(command, **quiet).returncode == 0:
        return True
    subprocess.run(["apt-get", "update", "-q"], **quiet)  # a fresh machine may have no package lists yet
    return subprocess.run(command, **quiet).returncode == 0


def prepare_browser() -> None:
    """Chromium for the browser tests: apt-get installs Debian's where it is missing and we are root (CI);
    otherwise say that those tests will be skipped, and the command that would install it."""
    if chromium():
        return
    if can_apt_get():
        say("installing Debian's chromium for the browser tests (apt-get install -y chromium)")
        apt_get_install(["chromium"])
        if not chromium():
            sys.exit("[course] apt-get could not install chromium, which the browser tests need; skip those "
                     "tests with:  python3 course.py test -m \"not browser\"")
        return
    say("Chromium is missing, so the browser tests will be SKIPPED. To run them, install it "
        "(Debian/Ubuntu: sudo apt-get install -y chromium) and run this again.")


def ensure_system_packages(packages: dict[str, str]) -> None:
    """Install the Debian packages of the missing commands where that can be done (root, apt-get); say so."""
    missing = sorted({package for command, package in packages.items() if shutil.which(command) is None})
    if not missing or not sys.platform.startswith("linux"):
        return
    names = " ".join(missing)
    if not can_apt_get():
        say(f"{names} missing, and it takes root and apt-get to install: the tests that need it are SKIPPED "
            f"(Debian/Ubuntu: sudo apt-get install -y {names})")
        return
    say(f"installing {names} with apt-get (the tests that need it would be skipped without it)")
    if not apt_get_install(missing):
        say(f"could not install {names}: the tests that need it are SKIPPED")
