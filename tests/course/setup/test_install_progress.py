"""course.py's install shows pip's progress in a few lines (course_lib/setup/pip_progress.py), and never stays silent
for long (pip -q printed nothing for 1 to 3 minutes on a fresh machine). pip itself is stood in for by a script that
prints what pip prints."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

from course_lib.setup.pip_progress import pip_with_progress

FAKE_PIP = textwrap.dedent('''
    import sys, time
    for name in ["torch", "torchvision", "jupyterlab"]:
        print(f"Collecting {name}==1.0 (from multigpu-course==0.1)", flush=True)
        time.sleep(0.3)
    print("Requirement already satisfied: numpy in ./.venv/lib (2.0)", flush=True)
    print("Processing /wheels/nvidia_cusparselt_cu13-0.8.1-py3-none-manylinux2014_x86_64.whl", flush=True)
    time.sleep(1.6)  # a long download: the heartbeat speaks
    print("Installing collected packages: torch, torchvision, jupyterlab", flush=True)
    time.sleep(0.3)
    print("Successfully installed jupyterlab-1.0 torch-1.0 torchvision-1.0", flush=True)
    print("WARNING: a warning of pip's own", file=sys.stderr)
    sys.exit(int(sys.argv[1]))
''')


def _fake_install(tmp_path, capfd, exit_code: int, heartbeat: float) -> tuple[int, str, str]:
    """pip_with_progress on the fake pip, ending with `exit_code`: its exit code, stdout and stderr."""
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    code = pip_with_progress([sys.executable, str(script), str(exit_code)], heartbeat=heartbeat)
    return (code, *capfd.readouterr())


def test_the_install_says_what_pip_is_doing_at_least_every_few_seconds(tmp_path, capfd):
    code, out, err = _fake_install(tmp_path, capfd, 0, heartbeat=0.5)
    assert code == 0
    lines = out.splitlines()
    assert all(line.startswith("[course] pip: ") for line in lines), out  # pip's own hundred lines are not shown
    heartbeat = re.compile(r"\[course\] pip: 5 packages so far, now nvidia_cusparselt_cu13 \(\d+ s\)")  # a wheel's name
    heartbeats = [line for line in lines if heartbeat.match(line)]
    assert heartbeats, out  # during the silent 1.6 s
    assert any("5 packages resolved; installing 3 of them" in line for line in lines), out
    assert lines[-1].startswith("[course] pip: installed 3 packages"), out
    assert "WARNING: a warning of pip's own" in err  # pip's stderr passes through


def test_a_failed_install_shows_what_pip_printed_last(tmp_path, capfd):
    code, out, err = _fake_install(tmp_path, capfd, 1, heartbeat=60)
    assert code == 1
    assert "Successfully installed jupyterlab-1.0" in err and "Collecting torchvision==1.0" in err, err


def test_a_stopped_install_stops_pip(tmp_path):
    """SIGTERM to course.py while pip runs: pip stops too (it is in course.py's process group, which a terminal's
    Ctrl-C reaches, but a SIGTERM sent to course.py alone does not)."""
    import os
    import signal
    import subprocess
    import time

    script = tmp_path / "slow_pip.py"
    script.write_text("import time\nprint('Collecting torch', flush=True)\ntime.sleep(60)\n")
    code = ("import sys\nfrom course_lib.setup.pip_progress import pip_with_progress\n"
            f"pip_with_progress([sys.executable, {str(script)!r}], heartbeat=0.2)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert "[course] pip: 1 packages so far, now torch" in parent.stdout.readline()  # pip is running
        children = [int(p) for p in open(f"/proc/{parent.pid}/task/{parent.pid}/children").read().split()]
        assert len(children) == 1
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=10)
        time.sleep(0.2)
        stat = Path(f"/proc/{children[0]}/stat")
        running = stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        assert not running, "pip still runs after course.py was stopped"
    finally:
        parent.kill()
        parent.wait()
