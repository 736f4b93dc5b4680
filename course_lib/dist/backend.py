"""Which backend the ranks use, and which device a rank's tensors belong on (notebook 04).

Without torch at import (it comes with the first call): importing course_lib.dist lets the graders' pytest start its
fork server, which imports torch, before it imports torch itself.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from course_lib.tables import plural

if TYPE_CHECKING:
    import torch

__all__ = ["choose_backend", "process_group_backend", "rank_device", "LaunchError"]


class LaunchError(RuntimeError):
    """A launch that could not start, or whose ranks did not all return (notebook 04)."""


def cuda_gpu_count() -> int:
    """course_lib.devices.cuda_gpu_count(), which imports torch: imported at the first call."""
    from course_lib import devices

    return devices.cuda_gpu_count()


def choose_backend(world_size: int, backend: str | None = None) -> tuple[str, str]:
    """The backend for `world_size` ranks and a sentence saying why (notebook 04).

    NCCL when every rank can have its own CUDA GPU, else gloo on the CPU.
    """
    import torch.distributed as dist

    gpus = cuda_gpu_count()
    if backend is None:
        if gpus >= world_size and dist.is_nccl_available():
            return "nccl", f"NCCL for CUDA tensors (gloo for CPU ones), one CUDA GPU per rank ({plural(gpus, 'GPU')} here)"
        if gpus == 0:
            why = "this machine has no CUDA GPU"
        else:
            why = f"{plural(world_size, 'rank')} but {plural(gpus, 'CUDA GPU')}, and NCCL needs a GPU per rank"
        return "gloo", f"gloo on the CPU ({why})"
    if backend == "nccl":
        if not dist.is_nccl_available() or gpus < world_size:
            raise LaunchError(
                f"backend='nccl' needs one CUDA GPU per rank: {plural(world_size, 'rank')} asked for, "
                f"{plural(gpus, 'GPU')} here. "
                "Use backend='gloo' (or leave backend=None to choose), or fewer ranks."
            )
        return "nccl", f"NCCL for CUDA tensors (gloo for CPU ones), one CUDA GPU per rank ({plural(gpus, 'GPU')} here)"
    if backend == "gloo":
        return "gloo", "gloo on the CPU (asked for)"
    raise LaunchError(f"backend must be None, 'gloo' or 'nccl', not {backend!r}")


def process_group_backend(backend: str) -> str:
    """The backend string `init_process_group` gets for `backend` (notebook 04).

    NCCL moves only CUDA tensors. A group made with "cpu:gloo,cuda:nccl" has a backend per device type, so the
    same ranks' CPU tensors (a loss for logging, notebook 00's first program) go through gloo instead of
    failing with "No backend type associated with device type cpu".
    """
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def rank_device() -> torch.device:
    """The device for this rank's tensors: its own GPU (cuda:LOCAL_RANK) under NCCL, else the CPU (notebook 04).

    Call it inside a rank. The GPU comes from the *local* rank, never the global one: on a second
    machine, global rank 11 is local rank 3 and there is no cuda:11.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise LaunchError("rank_device() is for code running in a rank: call it inside a function run by launch()")
    if "nccl" in str(dist.get_backend()):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
