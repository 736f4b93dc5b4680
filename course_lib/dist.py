"""Start distributed ranks from a notebook cell or a test (notebook 04 introduces `launch`).

`launch(fn, world_size, *args)` runs `fn(rank, world_size, *args)` in `world_size`
processes, each with an initialised process group, and returns their return
values in rank order:

* NCCL with one GPU per rank where there are enough CUDA GPUs, otherwise gloo
  ranks on the CPU; one line says which.
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

`python -m course_lib.dist` prints the launch-overhead benchmark.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import cloudpickle

from course_lib.devices import cuda_gpu_count, usable_cores

__all__ = [
    "launch",
    "torchrun",
    "choose_backend",
    "start_fork_server",
    "LaunchError",
    "RankFailed",
    "LaunchTimeout",
]


class LaunchError(RuntimeError):
    """A launch that could not start, or whose ranks did not all return (notebook 04)."""


class RankFailed(LaunchError):
    """A rank raised, exited early or returned something that could not come back (notebook 04)."""

    def __init__(self, rank: int, world_size: int, detail: str):
        self.rank, self.world_size, self.detail = rank, world_size, detail
        super().__init__(f"rank {rank} of {world_size} failed:\n{detail.rstrip()}")


class LaunchTimeout(LaunchError):
    """The ranks did not all finish within the timeout; all were killed (notebook 04)."""


def choose_backend(world_size: int, backend: str | None = None) -> tuple[str, str]:
    """The backend for `world_size` ranks and a sentence saying why (notebook 04).

    NCCL when every rank can have its own CUDA GPU, else gloo on the CPU.
    """
    import torch.distributed as dist

    gpus = cuda_gpu_count()
    if backend is None:
        if gpus >= world_size and dist.is_nccl_available():
            return "nccl", f"NCCL, one CUDA GPU per rank ({gpus} GPUs here)"
        if gpus == 0:
            why = "this machine has no CUDA GPU"
        else:
            why = f"{world_size} ranks but {gpus} CUDA GPUs, and NCCL needs a GPU per rank"
        return "gloo", f"gloo on the CPU ({why})"
    if backend == "nccl":
        if not dist.is_nccl_available() or gpus < world_size:
            raise LaunchError(
                f"backend='nccl' needs one CUDA GPU per rank: {world_size} ranks asked for, {gpus} GPUs here. "
                "Use backend='gloo' (or leave backend=None to choose), or fewer ranks."
            )
        return "nccl", f"NCCL, one CUDA GPU per rank ({gpus} GPUs here)"
    if backend == "gloo":
        return "gloo", "gloo on the CPU (asked for)"
    raise LaunchError(f"backend must be None, 'gloo' or 'nccl', not {backend!r}")


_context: mp.context.BaseContext | None = None


def start_fork_server() -> None:
    """Start the fork server that ranks are forked from, with torch already imported (notebook 04).

    The first launch calls this itself and pays about two seconds; calling it early hides that.
    """
    global _context
    if _context is None:
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["course_lib._rank"])
        _context = context
    from multiprocessing import forkserver

    with _ranks_do_not_import_main():
        forkserver.ensure_running()


_start_lock = threading.Lock()


@contextlib.contextmanager
def _ranks_do_not_import_main():
    """Stop multiprocessing from re-running the parent's __main__ in each rank.

    The function travels by value with cloudpickle, so the ranks never need the
    parent's script; re-running it would re-run an unguarded script's launch()
    in every rank (the classic missing `if __name__ == "__main__"`), and costs time.
    """
    original = mp_spawn.get_preparation_data

    def without_main(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    with _start_lock:
        mp_spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            mp_spawn.get_preparation_data = original


def _kill(process) -> None:
    """SIGKILL a rank's whole process group (the rank called setsid), then the rank itself."""
    if process.pid is None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.exitcode is None:
        try:
            process.kill()
        except (ProcessLookupError, AttributeError):
            pass
    process.join(timeout=5)


MAX_OUTPUT_BYTES = 2**20  # per rank: a print in a tight loop must not flood the notebook (or the grader)
MAX_RESULT_BYTES = 2**30  # per rank


class _OutputRelay:
    """Copies each rank's stdout and stderr into ours, line by line, with a `[rank N]` prefix."""

    def __init__(self, prefix: bool, limit: int = MAX_OUTPUT_BYTES):
        self.prefix, self.limit = prefix, limit
        self.partial: dict[tuple[int, int], bytes] = {}
        self.seen: dict[int, int] = {}

    def feed(self, rank: int, stream: int, data: bytes) -> None:
        seen = self.seen.get(rank, 0)
        self.seen[rank] = seen + len(data)
        if seen >= self.limit:
            return  # still read, so the rank never blocks on a full pipe, but no longer shown
        if seen + len(data) > self.limit:
            data = data[: self.limit - seen] + f"\n… rank {rank} printed more than {self.limit // 2**20} MiB; the rest is not shown\n".encode()
        data = self.partial.pop((rank, stream), b"") + data
        *lines, rest = data.split(b"\n")
        if rest:
            self.partial[(rank, stream)] = rest
        for line in lines:
            self._write(rank, stream, line)

    def flush(self) -> None:
        for (rank, stream), rest in sorted(self.partial.items()):
            self._write(rank, stream, rest)
        self.partial.clear()

    def _write(self, rank: int, stream: int, line: bytes) -> None:
        target = sys.stdout if stream == 1 else sys.stderr
        text = line.decode("utf-8", "replace")
        target.write(f"[rank {rank}] {text}\n" if self.prefix else f"{text}\n")
        target.flush()


def _pump_output(conn, output_fds: dict, relay: _OutputRelay) -> None:
    """Move what one rank wrote on one stream into the relay; forget the stream at EOF."""
    rank, stream = output_fds[conn]
    try:
        data = os.read(conn.fileno(), 65536)
    except OSError:
        data = b""
    if data:
        relay.feed(rank, stream, data)
    else:
        del output_fds[conn]
        conn.close()


def _decode_result(data: bytes, plain: bool):
    if plain:
        import io

        import torch

        return torch.load(io.BytesIO(data), weights_only=True)
    return cloudpickle.loads(data)


def _run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any],
    *,
    backend: str | None,
    init_process_group: bool,
    timeout: float,
    quiet: bool,
    prefix_output: bool,
    plain_results: bool,
    limits: dict | None,
    env: dict[str, str] | None,
) -> list[Any]:
    if not callable(fn):
        raise LaunchError(f"launch needs a function to run in each rank, not {type(fn).__name__}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise LaunchError(f"world_size must be a whole number of ranks, 1 or more, not {world_size!r}")
    if not timeout or timeout <= 0:
        raise LaunchError(f"timeout must be a positive number of seconds, not {timeout!r}")
    if init_process_group:
        backend, why = choose_backend(world_size, backend)
        if not quiet:
            print(f"[launch] {world_size} rank{'s' if world_size > 1 else ''} · {why}", flush=True)
    else:
        backend = None
    try:
        payload = cloudpickle.dumps((fn, tuple(args)))
    except Exception as exc:  # noqa: BLE001 - any pickling failure gets the same advice
        raise LaunchError(
            f"the function or its arguments cannot be sent to the ranks ({type(exc).__name__}: {exc}). "
            "Something it uses cannot be pickled (a lock, an open file, a generator, a CUDA stream...): "
            "create that object inside the function instead of passing or capturing it."
        ) from None

    start_fork_server()
    assert _context is not None
    from course_lib import _rank

    scratch = tempfile.mkdtemp(prefix="course-launch-")
    if limits and limits.get("uid") is not None and hasattr(os, "geteuid") and os.geteuid() == 0:
        # Ranks that switch to an unprivileged user (the grader) must still reach the rendezvous file.
        os.chown(scratch, limits["uid"], limits.get("gid", limits["uid"]))
    options = {
        "backend": backend,
        "store_path": os.path.join(scratch, "store"),
        # Collectives time out a little after the launch does, so a hang always ends as one LaunchTimeout.
        "pg_timeout": timeout + 10,
        "threads": max(1, usable_cores() // world_size),
        "plain_results": plain_results,
        "limits": limits,
        # The ranks fork from a server started earlier: hand them this process's environment as it is now.
        "env": {**os.environ, **(env or {})},
    }
    processes, result_conns, output_fds = [], {}, {}
    relay = _OutputRelay(prefix_output)
    results: dict[int, Any] = {}
    failure: RankFailed | None = None
    try:
        for rank in range(world_size):
            result_r, result_w = _context.Pipe(duplex=False)
            out_r, out_w = _context.Pipe(duplex=False)
            err_r, err_w = _context.Pipe(duplex=False)
            process = _context.Process(
                target=_rank.rank_main,
                args=(rank, world_size, payload, result_w, out_w, err_w, options),
                name=f"rank-{rank}",
                daemon=False,
            )
            with _ranks_do_not_import_main():
                process.start()
            for conn in (result_w, out_w, err_w):
                conn.close()  # the rank holds the only write ends, so EOF means it is gone
            processes.append(process)
            result_conns[result_r] = rank
            output_fds[out_r] = (rank, 1)
            output_fds[err_r] = (rank, 2)

        deadline = time.monotonic() + timeout
        sentinels = {p.sentinel: rank for rank, p in enumerate(processes)}
        exited: set[int] = set()

        def read_result(conn, rank: int) -> None:
            nonlocal failure
            try:
                message = conn.recv_bytes(MAX_RESULT_BYTES)
            except (EOFError, OSError) as exc:
                del result_conns[conn]
                if isinstance(exc, OSError) and "too long" in str(exc):
                    failure = failure or RankFailed(rank, world_size, f"its result is larger than {MAX_RESULT_BYTES // 2**20} MiB")
                return
            del result_conns[conn]
            kind, body = message[:1], message[1:]
            if kind == _rank.RESULT:
                try:
                    results[rank] = _decode_result(body, plain_results)
                except Exception as exc:  # noqa: BLE001
                    failure = failure or RankFailed(
                        rank,
                        world_size,
                        f"its return value could not be brought back as plain data ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}). Return tensors, numbers, strings, "
                        "lists, tuples or dicts of those.",
                    )
            else:
                failure = failure or RankFailed(rank, world_size, body.decode("utf-8", "replace"))

        while failure is None and (len(results) < world_size or len(exited) < world_size):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready = wait([*result_conns, *output_fds, *(s for s, r in sentinels.items() if r not in exited)],
                         timeout=remaining)
            for obj in ready:
                if obj in output_fds:
                    _pump_output(obj, output_fds, relay)
                elif obj in result_conns:
                    read_result(obj, result_conns[obj])
            for obj in ready:
                if obj in sentinels and sentinels[obj] not in exited:
                    rank = sentinels[obj]
                    exited.add(rank)
                    for conn, r in list(result_conns.items()):
                        if r == rank and conn.poll():  # a result sent just before exiting
                            read_result(conn, rank)
                    processes[rank].join(timeout=1)
                    code = processes[rank].exitcode
                    if rank not in results and failure is None:
                        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
                        failure = RankFailed(
                            rank,
                            world_size,
                            f"the rank process {how} without returning a result "
                            "(os._exit(), a crash, or running out of memory). A rank must return; "
                            "exiting early counts as a failure.",
                        )
                    elif code != 0 and failure is None:
                        failure = RankFailed(rank, world_size, f"it returned, then its process exited with code {code}")
        if failure is not None:
            raise failure
        if len(results) < world_size or len(exited) < world_size:
            done = sorted(results)
            stuck = [r for r in range(world_size) if r not in results]
            if not stuck:
                stuck = [r for r in range(world_size) if r not in exited]
                detail = f"rank(s) {stuck} returned but did not exit"
            else:
                detail = (
                    f"rank(s) {stuck} had not returned"
                    + (f" (rank(s) {done} had)" if done else "")
                    + ". A collective that not every rank calls, or calls in a different order, waits forever: "
                    "that is the usual cause."
                )
            raise LaunchTimeout(f"timed out after {timeout:g} s and killed all {world_size} ranks: {detail}")
        return [results[rank] for rank in range(world_size)]
    finally:
        for process in processes:
            _kill(process)
        # What the ranks printed before they stopped still belongs in the cell.
        drain_deadline = time.monotonic() + 1.0
        while output_fds and time.monotonic() < drain_deadline:
            for obj in wait(list(output_fds), timeout=max(0.0, drain_deadline - time.monotonic())):
                _pump_output(obj, output_fds, relay)
        relay.flush()
        for obj in [*output_fds, *result_conns]:
            obj.close()
        for process in processes:
            try:
                process.close()
            except ValueError:
                pass
        shutil.rmtree(scratch, ignore_errors=True)


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float = 60.0,
    quiet: bool = False,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` ranks with a process group; return their results (notebook 04).

    backend: None picks NCCL when each rank can have a CUDA GPU, else gloo; or say 'gloo' / 'nccl'.
    timeout: seconds for the whole run; then every rank is killed.
    quiet: do not print the line that says which backend runs.
    env: environment variables for the ranks (e.g. {"NCCL_DEBUG": "INFO"}), on top of this process's own.
    Raises RankFailed (a rank raised or exited early) or LaunchTimeout (a hang).
    """
    return _run_ranks(
        fn,
        world_size,
        args,
        backend=backend,
        init_process_group=True,
        timeout=timeout,
        quiet=quiet,
        prefix_output=True,
        plain_results=False,
        limits=None,
        env=env,
    )


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


def _benchmark(repeats: int = 7) -> None:
    """Warm launch overhead of `launch` against `torch.multiprocessing.spawn` doing the same work."""
    from course_lib.timing import print_table

    rows = []
    for world_size in (2, 4):
        ours, theirs = [], []
        launch(_bench_rank, world_size, quiet=True)  # warm the fork server
        for _ in range(repeats):
            t0 = time.perf_counter()
            launch(_bench_rank, world_size, quiet=True)
            ours.append(time.perf_counter() - t0)
        for _ in range(max(3, repeats // 2)):
            t0 = time.perf_counter()
            _spawn_same_work(world_size)
            theirs.append(time.perf_counter() - t0)
        ours.sort()
        theirs.sort()
        median_ours, median_theirs = ours[len(ours) // 2], theirs[len(theirs) // 2]
        rows.append([
            world_size,
            f"{median_ours:.3f}",
            f"{ours[0]:.3f}–{ours[-1]:.3f}",
            f"{median_theirs:.2f}",
            f"{theirs[0]:.2f}–{theirs[-1]:.2f}",
            f"{median_theirs / median_ours:.0f}×",
        ])
    print(f"Warm launch overhead, gloo CPU ranks that init and destroy a process group "
          f"({usable_cores()} cores, torch {__import__('torch').__version__})")
    print_table(
        ["ranks", "launch median s", "launch range s", "mp.spawn median s", "mp.spawn range s", "spawn / launch"],
        rows,
    )


def _bench_rank(rank: int, world_size: int) -> int:
    return rank


def _spawn_rank(rank: int, world_size: int, store_path: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    dist.destroy_process_group()


def _spawn_same_work(world_size: int) -> None:
    import torch.multiprocessing

    with tempfile.TemporaryDirectory() as scratch:
        torch.multiprocessing.spawn(_spawn_rank, args=(world_size, os.path.join(scratch, "store")), nprocs=world_size)


if __name__ == "__main__":
    _benchmark()
