"""`torchrun(script, n)`: run a script under torchrun with its output streamed into the cell (notebook 08)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import wait

from course_lib.dist.launcher import LaunchTimeout

__all__ = ["torchrun"]


def torchrun(
    script: str | os.PathLike,
    nproc_per_node: int,
    *script_args: str,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> int:
    """Run `torchrun --standalone --nproc-per-node N script args...` with its output streamed here (notebook 08).

    --standalone lets torchrun pick a free port, so runs never clash. Returns torchrun's exit code;
    on a timeout or an interrupt the whole process tree is killed.
    """
    script = os.fspath(script)
    if not os.path.exists(script):
        raise FileNotFoundError(f"no script at {script!r} (the cell's working directory is {os.getcwd()!r})")
    if not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a whole number of processes, 1 or more, not {nproc_per_node!r}")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc_per_node}",
        script, *map(str, script_args),
    ]
    print("[torchrun] " + " ".join(["torchrun", *command[3:]]), flush=True)
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        start_new_session=True,  # one process group: torchrun and its workers are killed together
    )
    deadline = time.monotonic() + timeout
    try:
        assert process.stdout is not None
        fd = process.stdout.fileno()
        pending = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchTimeout(f"torchrun did not finish within {timeout:g} s; it was killed")
            if not wait([fd], timeout=min(remaining, 0.5)):
                if process.poll() is not None:
                    break
                continue
            data = os.read(fd, 65536)
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                print(line.decode("utf-8", "replace"), flush=True)
        if pending:
            print(pending.decode("utf-8", "replace"), flush=True)
        return process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
