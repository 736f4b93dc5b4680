"""Run a script under torchrun with its output streamed into the cell (notebooks 05 and 08).

    torchrun(script, n, *args)                     one machine: `torchrun --standalone` (a free port)
    torchrun_nodes(script, nodes, n, *args)        several "nodes" on this machine: one torchrun agent per node,
                                                   joined by c10d rendezvous on 127.0.0.1 at a free port
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from multiprocessing.connection import wait

from course_lib.dist.launcher import LaunchTimeout

__all__ = ["torchrun", "torchrun_nodes"]


def torchrun(
    script: str | os.PathLike,
    nproc_per_node: int,
    *script_args: str,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    options: Sequence[str] = (),
) -> int:
    """Run `torchrun --standalone --nproc-per-node N script args...` with its output streamed here (notebook 08).

    --standalone lets torchrun pick a free port, so runs never clash. Returns torchrun's exit code;
    on a timeout or an interrupt the whole process tree is killed. options: more torchrun options, before the
    script (e.g. ["--max-restarts=1"]).
    """
    script = os.fspath(script)
    if not os.path.exists(script):
        raise FileNotFoundError(f"no script at {script!r} (the cell's working directory is {os.getcwd()!r})")
    if not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a whole number of processes, 1 or more, not {nproc_per_node!r}")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc_per_node}",
        *map(str, options), script, *map(str, script_args),
    ]
    print("[torchrun] " + " ".join(["torchrun", *command[3:]]), flush=True)
    return _run_agents([command], [""], env, timeout, "torchrun did not finish")[0]


def _run_agents(commands: list[list[str]], prefixes: list[str], env: dict[str, str] | None, timeout: float,
                late: str) -> list[int]:
    """Start each command in a process group of its own; print their lines as they come, each after its prefix;
    return their exit codes. At the timeout, or on an interrupt, every group is killed (`late` starts the error)."""
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
                 for command in commands]
    deadline = time.monotonic() + timeout
    try:
        open_fds = {p.stdout.fileno(): (prefix, b"") for p, prefix in zip(processes, prefixes)}
        while open_fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchTimeout(f"{late} within {timeout:g} s; {'it was' if len(processes) == 1 else 'they were'} "
                                    "killed")
            ready = wait(list(open_fds), timeout=min(remaining, 0.5))
            if not ready and all(p.poll() is not None for p in processes):
                break  # all exited, but something they started still holds the pipe open
            for fd in ready:
                prefix, pending = open_fds[fd]
                data = os.read(fd, 65536)
                if not data:
                    if pending:
                        print(prefix + pending.decode("utf-8", "replace"), flush=True)
                    del open_fds[fd]
                    continue
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    print(prefix + line.decode("utf-8", "replace"), flush=True)
                open_fds[fd] = (prefix, pending)
        for prefix, pending in open_fds.values():  # left by a break above: the last line without its newline
            if pending:
                print(prefix + pending.decode("utf-8", "replace"), flush=True)
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # the agent and its workers, together
                except ProcessLookupError:
                    pass
                process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun_nodes(
    script: str | os.PathLike,
    nnodes: int,
    nproc_per_node: int,
    *script_args: str,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    options: Sequence[str] = (),
) -> list[int]:
    """Run `nnodes` torchrun agents on this machine as if each were a node of its own (notebook 08).

    Each agent runs `torchrun --nnodes N --nproc-per-node n --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT
    --rdzv-id ID script args...`, exactly what each machine of a real cluster runs (there, the endpoint is the
    first node's address): PORT is a free port, ID a fresh one, so runs never clash. The agents' lines are printed
    as they come, each prefixed with its node. Returns each agent's exit code; on a timeout or an interrupt every
    agent's whole process tree is killed.
    """
    script = os.fspath(script)
    if not os.path.exists(script):
        raise FileNotFoundError(f"no script at {script!r} (the cell's working directory is {os.getcwd()!r})")
    for name, value in (("nnodes", nnodes), ("nproc_per_node", nproc_per_node)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a whole number, 1 or more, not {value!r}")
    endpoint, run_id = f"127.0.0.1:{_free_port()}", uuid.uuid4().hex[:12]
    common = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
              "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, *map(str, options), script, *map(str, script_args)]
    print("[torchrun] on each node: " + " ".join(["torchrun", *common]), flush=True)
    command = [sys.executable, "-m", "torch.distributed.run", *common]
    return _run_agents([command] * nnodes, [f"[node {node}] " for node in range(nnodes)], env, timeout,
                       "the torchrun agents did not finish")
