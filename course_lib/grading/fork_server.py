"""The graded tests' fork server: what it imports before forking any rank, and its start before pytest imports torch.

Importing this module imports no torch, so the plugin starts the fork server (about 2.5 s of importing on a core of
its own) first and only then imports the runner, and with it torch, in pytest's process (notebook 00's `check`:
1.4 s sooner on 2 cores).
"""

from __future__ import annotations

from typing import Any

from course_lib.dist.forkserver import preload, start_fork_server

__all__ = ["PRELOADS", "register_preloads", "start_graders_fork_server"]

# Imported once in the fork server rather than in every child that needs them: the runner (every child unpickles
# _in_child from it; ~20 ms a launch), and what the graded tests' drivers and the solutions import, by how often
# and how long (measured over the nine exercises' tests: torch.distributed.fsdp 0.75 s in each rank of ex08's
# grad-scaler test; simgpu 16 ms in 32 launches; the others 1-19 ms in 13 to 135 launches).
PRELOADS = ("course_lib.grading.runner", "course_lib.grading.shortcuts", "course_lib.grading.collective_log",
            "course_lib.grading.simgpu", "course_lib.grading.nesting", "torch.utils.serialization",
            "course_lib.parallel.data_parallel", "course_lib.parallel.ddp", "course_lib.precision",
            "torch.distributed.algorithms.ddp_comm_hooks", "torch.distributed.fsdp")


def register_preloads() -> None:
    """Have the next fork server import PRELOADS too (the runner calls it at import: a notebook's runs get them)."""
    for module in PRELOADS:
        preload(module)


def start_graders_fork_server(confinement: Any = None) -> None:
    """Start the fork server the graded tests' ranks come from, in `confinement`'s sandbox if it has one, and
    return at once: it imports torch and the preloads while pytest collects the tests."""
    register_preloads()
    start_fork_server(getattr(confinement, "fork_server_executable", None))
