"""What `python3 course.py` does around its commands (the README's set-up, before notebook 00), with the standard
library only: the system python3 runs it before the course's environment, or torch, exists.

install.py: the course's environment, and when and what pip installs into it; pip_progress.py: pip's progress in a
few lines; system_packages.py: what the course's own tests need from the system (Chromium, bubblewrap), apt-get;
processes.py: running a command so that Ctrl-C or SIGTERM stops everything it started.
"""


def say(message: str) -> None:
    print(f"[course] {message}", flush=True)
