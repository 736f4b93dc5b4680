"""Start distributed ranks from a notebook cell or a test (notebook 04 introduces `launch`).

`launch(fn, world_size, *args)` runs `fn(rank, world_size, *args)` in `world_size`
processes, each with an initialised process group, and returns their return
values in rank order:

* NCCL with one GPU per rank where there are enough CUDA GPUs, otherwise gloo
  ranks on the CPU; one line says which. `rank_device()` is the device a rank's
  tensors belong on.
* Functions defined in a notebook cell work: they travel with cloudpickle.
* No port: ranks meet through a `FileStore` on a fresh temporary file.
* A rank that raises is reported at once, with its traceback; a hang is killed
  at `timeout`; `sys.exit()` or `os._exit()` in a rank is a failure.
* Every rank (and anything it started) is killed in `finally`; ranks also die
  with the kernel.
* Ranks are forked from a fork server that has torch imported already, so a
  launch costs about a tenth of a second rather than seconds.

`torchrun(script, nproc_per_node, *args)` runs a script under torchrun with its
output streamed into the cell.

Inside: backend.py (which backend, which device), launcher.py (the parent's side),
forkserver.py (the fork server, also in the grader's sandbox), rank.py (what runs in each
rank), relay.py (the ranks' output), torchrun.py.
`python benchmarks/launch_overhead.py` measures the launch overhead.
"""

from course_lib.dist.backend import LaunchError, choose_backend, rank_device
from course_lib.dist.forkserver import start_fork_server
from course_lib.dist.launcher import LaunchTimeout, RankFailed, RankJob, launch, run_ranks
from course_lib.dist.torchrun import torchrun, torchrun_nodes

__all__ = ["launch", "torchrun", "torchrun_nodes", "choose_backend", "rank_device", "start_fork_server", "run_ranks", "RankJob",
           "LaunchError", "RankFailed", "LaunchTimeout"]
