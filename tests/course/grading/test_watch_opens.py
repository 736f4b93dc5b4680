"""The grader's tripwire (confinement.watch_opens): which opens it records, in a child process of its own, since
an audit hook stays for the life of its process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import os, sys
    from course_lib.grading.confinement import watch_opens

    tmp, log = sys.argv[1], sys.argv[2]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    sys.path.append(os.path.join(tmp, "host", "judge"))  # a folder on sys.path: allowed by name (zipimport opens it)
    allowed = [*sys.path, sys.prefix, sys.base_prefix, "/usr", "/tmp", os.path.join(tmp, "host", "venv")]
    watch_opens([p for p in allowed if p], fd, host_only=[os.path.join(tmp, "host")])
    for path in ("host/solutions/ex00_warmup.py", "host/venv/lib/site.py", "mine/notes.txt", "host/judge"):
        try:
            open(os.path.join(tmp, path)).close()
        except OSError:
            pass
""")


def test_the_hosts_folders_under_the_private_tmp_are_outside_unless_bound(tmp_path):
    """A sandbox's /tmp is its own: the host's checkout in /tmp is outside it (its solutions/), except the folders
    bound into the sandbox (its .venv); what the student makes in its own /tmp is not."""
    (tmp_path / "host" / "judge").mkdir(parents=True)
    for path in ("host/solutions/ex00_warmup.py", "host/venv/lib/site.py", "mine/notes.txt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    log = tmp_path / "outside.log"
    log.touch()
    root = Path(__file__).resolve().parents[3]
    subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(log)], check=True, cwd=root,
                   env={**os.environ, "PYTHONPATH": str(root)})
    recorded = log.read_text().splitlines()
    assert f"opened\t{tmp_path}/host/solutions/ex00_warmup.py" in recorded, recorded
    assert not [line for line in recorded if "venv" in line or "mine" in line or "judge" in line], recorded
