"""course_lib.dist.launch: results, failures, hangs, clean-up, output, and no port clashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from course_lib.devices import cuda_gpu_count
from course_lib.dist import (LaunchError, LaunchTimeout, RankFailed, launch, start_fork_server, torchrun,
                             torchrun_nodes)
from course_lib.dist.launcher import RankJob, run_ranks


def _sum_of_ranks(rank, world_size):
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return {"rank": rank, "sum": t, "env_rank": os.environ["RANK"], "local_rank": os.environ["LOCAL_RANK"]}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def _wait_dead(pids, seconds=10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_results_come_back_in_rank_order(world_size):
    results = launch(_sum_of_ranks, world_size, quiet=True)
    expected_sum = world_size * (world_size + 1) / 2
    assert [r["rank"] for r in results] == list(range(world_size))
    assert [r["env_rank"] for r in results] == [str(r) for r in range(world_size)]
    assert [r["local_rank"] for r in results] == [str(r) for r in range(world_size)]
    for r in results:
        torch.testing.assert_close(r["sum"], torch.tensor([expected_sum]))


def _is_rank_0_still_up_after_it_returned(rank, world_size):
    import torch.distributed as dist

    pids = [None] * world_size
    dist.all_gather_object(pids, os.getpid())
    if rank == 0:
        return True
    time.sleep(1.0)  # rank 0 has long returned; without the wait at the end it destroys its groups and exits now
    return _alive(pids[0])


def test_no_rank_tears_its_groups_down_before_every_rank_has_returned():
    """A group a function makes (new_group, init_device_mesh) is connected when new_group returns on one rank, not
    on its peers: a rank that exits at once closes sockets a slow peer is still connecting (gloo: "connectFullMesh
    failed [...] Connection closed by peer", 5 of 250 launches of lesson 07's 2 x 2 mesh under load, before)."""
    assert launch(_is_rank_0_still_up_after_it_returned, 2, quiet=True) == [True, True]


def test_a_function_defined_at_run_time_in_main_travels_by_value():
    # What a notebook cell does: a function whose module is __main__ and cannot be imported by the ranks.
    namespace = {"__name__": "__main__"}
    exec(textwrap.dedent("""
        SCALE = 10
        def helper(x):
            return x * SCALE
        def cell_function(rank, world_size, offset):
            return helper(rank) + offset
    """), namespace)
    assert launch(namespace["cell_function"], 2, 5, quiet=True) == [5, 15]


def _raise_in_rank_1(rank, world_size):
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("a learner's bug in rank 1")
    dist.barrier()  # rank 0 would wait here forever: the failure must still be reported at once


def test_a_rank_that_raises_is_reported_promptly_with_its_traceback():
    start_fork_server()  # time the failure, not the one-off start of the fork server
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        launch(_raise_in_rank_1, 2, timeout=60, quiet=True)
    assert time.monotonic() - start < 30, "the failure must not wait for the 60 s timeout"
    assert info.value.rank == 1
    message = str(info.value)
    assert "rank 1 of 2" in message and "a learner's bug in rank 1" in message
    assert "_raise_in_rank_1" in message, "the rank's traceback should name the failing function"


def _hang_in_mismatched_collective(rank, world_size, pid_dir):
    import torch.distributed as dist

    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == 0:
        dist.barrier()  # rank 1 never joins
    else:
        time.sleep(1000)


def test_a_hang_is_killed_at_the_timeout_and_leaves_no_process(tmp_path):
    start_fork_server()
    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match="timed out after 3 s") as info:
        launch(_hang_in_mismatched_collective, 2, str(tmp_path), timeout=3, quiet=True)
    elapsed = time.monotonic() - start
    assert 2.9 < elapsed < 40  # generous: this machine may be busy
    assert "collective" in str(info.value)
    assert max(len(line) for line in str(info.value).splitlines()) <= 100  # a notebook shows it without breaking words
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert len(pids) == 2
    assert _wait_dead(pids) == []


def _exit_in_rank_1(rank, world_size, how):
    if rank == 1:
        if how == "sys.exit":
            sys.exit(0)
        os._exit(0)
    return "rank 0 fine"


@pytest.mark.parametrize("how", ["sys.exit", "os._exit"])
def test_exiting_from_a_rank_is_a_failure_not_a_success(how):
    with pytest.raises(RankFailed) as info:
        launch(_exit_in_rank_1, 2, how, timeout=30, quiet=True)
    assert info.value.rank == 1
    assert "counts as a failure" in str(info.value)


def _start_grandchild_then_hang(rank, world_size, pid_dir):
    child = subprocess.Popen(["sleep", "1000"])
    Path(pid_dir, f"grandchild-{rank}").write_text(str(child.pid))
    Path(pid_dir, f"rank-{rank}").write_text(str(os.getpid()))
    time.sleep(1000)


def test_processes_started_by_a_rank_are_killed_too(tmp_path):
    with pytest.raises(LaunchTimeout):
        launch(_start_grandchild_then_hang, 2, str(tmp_path), timeout=3, quiet=True)
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert len(pids) == 4
    assert _wait_dead(pids) == []


def test_an_interrupt_kills_the_ranks(tmp_path):
    # What pressing "interrupt kernel" does: SIGINT to the process waiting in launch().
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(_hang_in_mismatched_collective, 2, str(tmp_path), timeout=60, quiet=True)
    finally:
        timer.cancel()
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert pids and _wait_dead(pids) == []


KILLED_PARENT = """
import sys
from course_lib.dist import launch
from pathlib import Path
import os, time

def hang(rank, world_size, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    time.sleep(1000)

launch(hang, 2, sys.argv[1], timeout=600, quiet=True)
"""


def test_ranks_die_when_the_kernel_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(KILLED_PARENT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    parent = subprocess.Popen([sys.executable, str(script), str(pid_dir)])
    try:
        deadline = time.monotonic() + 60
        while len(list(pid_dir.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in pid_dir.iterdir()]
        assert len(pids) == 2, "the ranks never started"
        parent.kill()  # SIGKILL: no finally runs in the parent
        parent.wait()
        assert _wait_dead(pids) == [], "ranks outlived their killed parent"
    finally:
        parent.kill()


def _print_lines(rank, world_size):
    print(f"hello from {rank}")
    print(f"warning from {rank}", file=sys.stderr)
    os.write(1, f"raw fd write from {rank}\n".encode())  # what C++ code does
    return rank


def test_each_ranks_output_is_shown_with_its_rank(capfd):
    launch(_print_lines, 2, quiet=True)
    out, err = capfd.readouterr()
    for rank in (0, 1):
        assert f"[rank {rank}] hello from {rank}" in out
        assert f"[rank {rank}] raw fd write from {rank}" in out
        assert f"[rank {rank}] warning from {rank}" in err


def test_the_backend_is_announced(capsys):
    launch(_sum_of_ranks, 2)
    out = capsys.readouterr().out
    gpus = cuda_gpu_count()
    assert "[launch] 2 ranks" in out
    assert ("NCCL" in out) if gpus >= 2 else ("gloo on the CPU" in out)


CONCURRENT = """
import torch
from course_lib.dist import launch

def work(rank, world_size):
    import torch.distributed as dist
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    return t.sum().item()

print(launch(work, 2, quiet=True))
"""


def test_ten_launches_from_different_processes_at_once_never_clash(tmp_path):
    script = tmp_path / "launch_once.py"
    script.write_text(CONCURRENT)
    processes = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(10)]
    outputs = [p.communicate(timeout=300) for p in processes]
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, err
        assert out.strip() == "[4.0, 4.0]"


def _return_a_generator(rank, world_size):
    return (i for i in range(3))


def test_a_result_that_cannot_come_back_is_a_clear_failure():
    with pytest.raises(RankFailed, match="could not"):
        launch(_return_a_generator, 2, quiet=True)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: launch(_sum_of_ranks, 0), "world_size must be"),
        (lambda: launch(_sum_of_ranks, "2"), "world_size must be"),
        (lambda: launch("not a function", 2), "needs a function"),
        (lambda: launch(_sum_of_ranks, 2, timeout=0), "timeout must be"),
        (lambda: launch(_sum_of_ranks, 2, backend="mpi"), "backend must be"),
        (lambda: launch(_sum_of_ranks, 2, threading.Lock()), "cannot be sent to the ranks"),
    ],
)
def test_bad_input_gets_a_clear_error_before_any_rank_starts(call, message):
    with pytest.raises(LaunchError, match=message):
        call()


@pytest.mark.skipif(cuda_gpu_count() >= 2, reason="this machine has the GPUs NCCL needs")
def test_nccl_without_enough_gpus_says_what_to_do():
    with pytest.raises(LaunchError, match="backend='gloo'"):
        launch(_sum_of_ranks, 2, backend="nccl")


def _what_cuda_the_rank_sees(rank, world_size):
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available(), torch.cuda.device_count()


def test_gloo_ranks_see_no_gpu_unless_env_says_so_and_the_graders_runner_keeps_it(monkeypatch):
    # A machine with fewer GPUs than ranks runs gloo ranks as a laptop would: torch code that asks
    # torch.cuda.is_available() (FSDP2's default mesh, PowerSGD's hook) must not take its GPU path.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert launch(_what_cuda_the_rank_sees, 2, backend="gloo", quiet=True) == [("", False, 0)] * 2
    assert launch(_what_cuda_the_rank_sees, 2, quiet=True, env={"CUDA_VISIBLE_DEVICES": "0"})[0][0] == "0"
    graded = run_ranks(RankJob(_what_cuda_the_rank_sees, 2, backend="gloo", quiet=True))
    assert [seen for seen, _, _ in graded] == ["0", "0"], "graded tests on a GPU machine keep their GPU"


def _thread_affinities(rank, world_size):
    return sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_check_ranks_keep_to_a_core_each_only_where_they_have_a_thread_each():
    cores = sorted(os.sched_getaffinity(0))
    if not 2 <= len(cores) <= 3:
        pytest.skip(f"launches as many ranks as cores, and one more: wants 2 or 3 cores, this machine has {len(cores)}")
    for world_size in (len(cores), len(cores) + 1):
        kept = run_ranks(RankJob(_thread_affinities, world_size, backend="gloo", quiet=True, one_core_per_rank=True))
        assert kept == [[(cores[rank % len(cores)],)] for rank in range(world_size)], (
            "every thread of rank r, gloo's network thread included, on core r mod n")
    free = [[tuple(cores)]] * (len(cores) - 1)
    assert run_ranks(RankJob(_thread_affinities, len(cores) - 1, backend="gloo", quiet=True,
                             one_core_per_rank=True)) == free, "fewer ranks than cores: the scheduler moves them"
    assert launch(_thread_affinities, len(cores), quiet=True) == [[tuple(cores)]] * len(cores), (
        "a learner's launch measures gloo as torchrun runs it")


@pytest.mark.gpu(2)
def test_nccl_ranks_each_get_their_own_gpu():
    def on_gpu(rank, world_size):
        import torch.distributed as dist

        t = torch.ones(2, device="cuda") * rank
        dist.all_reduce(t)
        return {"device": torch.cuda.current_device(), "sum": t}

    results = launch(on_gpu, 2)
    assert [r["device"] for r in results] == [0, 1]
    assert all(r["sum"].device.type == "cpu" for r in results), "tensors come back on the CPU"


TORCHRUN_SCRIPT = """
import os
import sys
from datetime import timedelta
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
try:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    # one write per line: an unbuffered print writes the text and the newline apart, and two ranks' lines can mix
    sys.stdout.write(f"rank {dist.get_rank()} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']} sum {t.item():g}\\n")
    sys.stdout.flush()
finally:
    dist.destroy_process_group()
"""


def test_torchrun_streams_the_scripts_output(tmp_path, capsys):
    script = tmp_path / "allreduce.py"
    script.write_text(TORCHRUN_SCRIPT)
    code = torchrun(script, 2, timeout=180)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "rank 0 of 2 local 0 sum 3" in out and "rank 1 of 2 local 1 sum 3" in out


def test_torchrun_nodes_joins_two_agents_into_one_world(tmp_path, capsys):
    """Two torchrun agents, one per "node", 2 processes each, meet through c10d rendezvous at a free port."""
    script = tmp_path / "allreduce.py"
    script.write_text(TORCHRUN_SCRIPT.replace("local {os.environ['LOCAL_RANK']}",
                                              "local {os.environ['LOCAL_RANK']} node {os.environ['GROUP_RANK']}"))
    codes = torchrun_nodes(script, 2, 2, timeout=180)
    out = capsys.readouterr().out
    assert codes == [0, 0], out
    seen = sorted(line.split("] ", 1)[1] for line in out.splitlines() if " of 4 " in line)
    assert len(seen) == 4 and all(line.endswith("sum 10") for line in seen), out   # 1 + 2 + 3 + 4
    assert {line.split(" node ")[1].split()[0] for line in seen} == {"0", "1"}, out
    assert "--rdzv-endpoint 127.0.0.1:" in out and "29500" not in out


def test_torchrun_with_a_missing_script_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no script"):
        torchrun(tmp_path / "nope.py", 2)
    with pytest.raises(FileNotFoundError, match="no script"):
        torchrun_nodes(tmp_path / "nope.py", 2, 1)


def _flood(rank, world_size):
    line = "x" * 1000
    for _ in range(3000):  # about 3 MB
        print(line)
    return rank


def test_a_flood_of_output_is_cut_off_and_the_launch_still_finishes(capfd):
    assert launch(_flood, 2, quiet=True, timeout=60) == [0, 1]
    out, _ = capfd.readouterr()
    assert "rank 0 printed more than 1 MiB; the rest is not shown" in out
    assert len(out) < 2 * 1.2 * 2**20


def _read_env(rank, world_size):
    return os.environ.get("COURSE_TEST_SET_LATE"), os.environ.get("COURSE_TEST_PASSED")


def test_ranks_see_the_environment_as_it_is_at_launch(monkeypatch):
    launch(_read_env, 1, quiet=True)  # the fork server is running before the variable is set
    monkeypatch.setenv("COURSE_TEST_SET_LATE", "yes")
    assert launch(_read_env, 2, quiet=True, env={"COURSE_TEST_PASSED": "NCCL_DEBUG-like"}) == [
        ("yes", "NCCL_DEBUG-like")
    ] * 2


def _debug_level(rank, world_size):
    import torch.distributed as dist

    return str(dist.get_debug_level())


def test_torch_distributed_debug_reaches_the_ranks():
    # torch reads it at import, which the fork server did before the variable existed
    assert launch(_debug_level, 2, quiet=True, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}) == ["DebugLevel.DETAIL"] * 2
    assert launch(_debug_level, 2, quiet=True) == ["DebugLevel.OFF"] * 2


def test_nccl_launches_make_groups_that_also_serve_cpu_tensors():
    # On a CPU-only machine a NCCL group cannot be created, so this checks the decision with torch's own parser:
    # the backend string that NCCL launches pass to init_process_group maps CPU tensors to gloo.
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    from course_lib.dist.backend import process_group_backend

    assert BackendConfig(Backend(process_group_backend("nccl"))).get_device_backend_map() == {
        "cpu": "gloo", "cuda": "nccl"}
    assert process_group_backend("gloo") == "gloo"


def _cpu_and_cuda_tensors(rank, world_size):
    import torch.distributed as dist

    from course_lib.dist import rank_device

    on_cpu, on_gpu = torch.ones(2), torch.ones(2, device=rank_device())
    dist.all_reduce(on_cpu)  # through gloo
    dist.all_reduce(on_gpu)  # through NCCL
    return {"cpu": on_cpu, "gpu": on_gpu, "device": str(rank_device())}


@pytest.mark.gpu(1)
def test_one_gpu_launch_runs_collectives_on_cpu_and_cuda_tensors():
    (result,) = launch(_cpu_and_cuda_tensors, 1, quiet=True)  # one GPU: launch picks NCCL
    assert result["device"] == "cuda:0"
    assert torch.equal(result["cpu"], torch.ones(2)) and torch.equal(result["gpu"], torch.ones(2))
