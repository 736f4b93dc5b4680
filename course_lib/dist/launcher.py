"""`launch`: start ranks from a notebook cell or a test, and bring their results back (notebook 04).

The parent's side of a launch. Ranks are forked from a fork server that has torch imported already
(`course_lib.dist.rank` is its preload), so a launch costs about a tenth of a second. Each rank gets one result
pipe and two output pipes; the parent watches them together with the process sentinels, so a failure is reported
at once and a hang at the deadline, and every rank (with anything it started) is killed in `finally`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import cloudpickle

from course_lib.dist.backend import LaunchError, choose_backend
from course_lib.dist.forkserver import (ranks_do_not_import_main, context, kill_sandbox_processes, sandboxed,
                                        start_fork_server)
from course_lib.dist.relay import OutputRelay
from course_lib.tables import plural

__all__ = ["launch", "run_ranks", "RankJob", "RankFailed", "LaunchTimeout"]

MAX_RESULT_BYTES = 2**30  # per rank
WIDTH = 100  # characters per line of the launcher's own messages: a notebook breaks longer ones mid-word

# Where PyTorch's CI built a C++ source, at the start of gloo's messages: "[/__w/pytorch/.../unbound_buffer.cc:78] "
_BUILD_PATH = re.compile(r"\[/[^\]\s]+\.(?:cc|cpp|cxx|c|h|hpp|cu):\d+\] ?")


class RankFailed(LaunchError):
    """A rank raised, exited early or returned something that could not come back (notebook 04)."""

    def __init__(self, rank: int, world_size: int, detail: str):
        detail = _BUILD_PATH.sub("", detail)  # a path on PyTorch's build machine tells a learner nothing
        self.rank, self.world_size, self.detail = rank, world_size, detail
        super().__init__(f"rank {rank} of {world_size} failed:\n{detail.rstrip()}")


class LaunchTimeout(LaunchError):
    """The ranks did not all finish within the timeout; all were killed (notebook 04)."""


@dataclass
class RankJob:
    """One launch: what runs in how many ranks, and how. `launch` and the graded tests' runner fill it in."""

    fn: Callable[..., Any]
    world_size: int
    args: Sequence[Any] = ()
    backend: str | None = None  # None: NCCL when each rank can have a GPU, else gloo
    init_process_group: bool = True  # False: plain child processes, no process group
    timeout: float = 60.0  # seconds for the whole run
    quiet: bool = False  # do not announce the backend
    prefix_output: bool = True  # "[rank N] " before each line a rank prints
    plain_results: bool = False  # results come back only as plain data (torch.load weights_only)
    env: dict[str, str] | None = None  # extra environment variables for the ranks
    # gloo ranks run on the CPU: hide CUDA (CUDA_VISIBLE_DEVICES="") unless env sets it, else torch code asking
    # cuda.is_available() takes a GPU path on CPU tensors (one GPU, torch 2.11: fully_shard's mesh calls set_device,
    # PowerSGD syncs a CPU device, a gloo DeviceMesh makes a 2nd group). launch() sets it; graded tests keep the GPU.
    gloo_ranks_see_no_gpu: bool = False
    # The grader's policy: prepare_folder(path) here, apply() in each rank, fork_server_executable (its sandbox).
    confinement: Any = None
    # Seconds after which each rank still running writes its stack (faulthandler) to a file of the launch; the
    # texts come back in `stacks` {rank: text} when the launch ends, even when it was stopped (the grader's loops).
    dump_stacks_after: float | None = None
    stacks: dict[int, str] = field(default_factory=dict, repr=False)
    # course_lib.dist.sharing_cores: gloo's network thread at nice 19 (the graders' runner), and gloo ranks with no
    # more cores than ranks each kept to one (check()'s ranks only). Learners' launches do neither.
    yield_gloo_network_thread: bool = False
    one_core_per_rank: bool = False


def launch(fn: Callable[..., Any], world_size: int, *args: Any, backend: str | None = None,
           timeout: float = 60.0, quiet: bool = False, env: dict[str, str] | None = None) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` ranks with a process group; return their results (notebook 04).

    backend: None picks NCCL when each rank can have a CUDA GPU, else gloo; or say 'gloo' / 'nccl'.
    timeout: seconds for the whole run; then every rank is killed.
    quiet: do not print the line that says which backend runs.
    env: environment variables for the ranks (e.g. {"NCCL_DEBUG": "INFO"}), on top of this process's own.
    Under gloo the ranks run on the CPU and see no CUDA GPU (CUDA_VISIBLE_DEVICES is "" unless env sets it), so a
    machine with fewer GPUs than ranks runs the same code as a laptop.
    Raises RankFailed (a rank raised or exited early) or LaunchTimeout (a hang).
    """
    return run_ranks(RankJob(fn, world_size, args, backend=backend, timeout=timeout, quiet=quiet, env=env,
                             gloo_ranks_see_no_gpu=True))


def run_ranks(job: RankJob) -> list[Any]:
    """Run a `RankJob`; return the ranks' results in rank order, or raise RankFailed / LaunchTimeout."""
    run = _Launch(job)
    try:
        run.start()
        return run.wait()
    finally:
        run.close()


def _check(job: RankJob) -> None:
    if not callable(job.fn):
        raise LaunchError(f"launch needs a function to run in each rank, not {type(job.fn).__name__}")
    n = job.world_size
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise LaunchError(f"world_size must be a whole number of ranks, 1 or more, not {n!r}")
    if not job.timeout or job.timeout <= 0:
        raise LaunchError(f"timeout must be a positive number of seconds, not {job.timeout!r}")


def _payload(job: RankJob) -> bytes:
    try:
        return cloudpickle.dumps((job.fn, tuple(job.args)))
    except Exception as exc:  # noqa: BLE001 - any pickling failure gets the same advice
        raise LaunchError(textwrap.fill(
            f"the function or its arguments cannot be sent to the ranks ({type(exc).__name__}: {exc}). "
            "Something it uses cannot be pickled (a lock, an open file, a generator, a CUDA stream...): "
            "create that object inside the function instead of passing or capturing it.", WIDTH)
        ) from None


def _ranks(ranks: Sequence[int]) -> str:
    """'Rank 2' or 'Ranks 0, 1': the ranks a message is about, by number."""
    return f"{plural(len(ranks), 'Rank', number=False)} {', '.join(map(str, ranks))}"


def _decode_result(data: bytes, plain: bool):
    if plain:
        import io

        import torch

        return torch.load(io.BytesIO(data), weights_only=True)
    return cloudpickle.loads(data)


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


class _Launch:
    """One launch in flight: its processes, their pipes, and what has come back."""

    def __init__(self, job: RankJob, keep: bool = False):
        _check(job)
        self.job, self.n = job, job.world_size
        self.keep = keep  # the ranks stay up after returning, for further runs (course_lib.dist.warm)
        self.job_conns: list = []  # the write ends of the kept ranks' job pipes
        self.reusable = keep
        self.all_result_conns: dict = {}
        self.backend = None
        if job.init_process_group:
            self.backend, why = choose_backend(self.n, job.backend)
            if not job.quiet:
                print(f"[launch] {plural(self.n, 'rank')} · {why}", flush=True)
        self.payload = _payload(job)
        self.processes: list = []
        self.result_conns: dict = {}  # read end of a rank's result pipe -> rank
        self.relay = OutputRelay(job.prefix_output)
        self.results: dict[int, Any] = {}
        self.exited: set[int] = set()
        self.failure: RankFailed | None = None
        self.scratch: str | None = None
        self.longest_run = job.timeout  # the seconds of the longest run these ranks serve (a kept launch's: more)

    def start(self) -> None:
        from course_lib.devices import usable_cores
        from course_lib.dist import rank as rank_module

        start_fork_server(getattr(self.job.confinement, "fork_server_executable", None))
        self.scratch = tempfile.mkdtemp(prefix="course-launch-")
        if self.job.confinement is not None:
            self.job.confinement.prepare_folder(self.scratch)  # e.g. the grader's user must reach the store
        options = rank_module.RankOptions(
            backend=self.backend,
            store_path=os.path.join(self.scratch, "store"),
            # Collectives time out a little after the launch does, so a hang always ends as one LaunchTimeout.
            pg_timeout=self.longest_run + 10,
            threads=max(1, usable_cores() // self.n),
            plain_results=self.job.plain_results,
            # The ranks fork from a server started earlier: hand them this process's environment as it is now.
            env={**os.environ, **self._hidden_gpus(), **(self.job.env or {})},
            confinement=self.job.confinement,
            stack_file=os.path.join(self.scratch, "stack") if self.job.dump_stacks_after is not None else None,
            stack_after=self.job.dump_stacks_after,
            yield_gloo_network_thread=self.job.yield_gloo_network_thread,
            one_core_per_rank=self.job.one_core_per_rank and self.backend == "gloo" and usable_cores() <= self.n,
        )
        for rank in range(self.n):
            result_r, result_w = context().Pipe(duplex=False)
            out_r, out_w = context().Pipe(duplex=False)
            err_r, err_w = context().Pipe(duplex=False)
            job_r, job_w = context().Pipe(duplex=False) if self.keep else (None, None)
            process = context().Process(target=rank_module.rank_main, name=f"rank-{rank}", daemon=False,
                                       args=(rank, self.n, self.payload, result_w, out_w, err_w, options, job_r))
            with ranks_do_not_import_main(sandboxed()):
                process.start()
            for conn in (result_w, out_w, err_w, job_r):
                if conn is not None:
                    conn.close()  # the rank holds the only write ends, so EOF means it is gone
            if job_w is not None:
                self.job_conns.append(job_w)
            self.processes.append(process)
            self.result_conns[result_r] = rank
            self.all_result_conns[result_r] = rank
            self.relay.watch(out_r, rank, 1)
            self.relay.watch(err_r, rank, 2)

    def _hidden_gpus(self) -> dict[str, str]:
        hide = self.job.gloo_ranks_see_no_gpu and self.job.init_process_group and self.backend == "gloo"
        return {"CUDA_VISIBLE_DEVICES": ""} if hide else {}

    def wait(self) -> list[Any]:
        deadline = time.monotonic() + self.job.timeout
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        while self.failure is None and (len(self.results) < self.n or (not self.keep and len(self.exited) < self.n)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            alive = [s for s, r in sentinels.items() if r not in self.exited]
            ready = wait([*self.result_conns, *self.relay.streams, *alive], timeout=remaining)
            for obj in ready:
                if obj in self.relay.streams:
                    self.relay.pump(obj)
                elif obj in self.result_conns:
                    self._read_result(obj)
            for obj in ready:
                if obj in sentinels and sentinels[obj] not in self.exited:
                    self._on_exit(sentinels[obj])
        if self.failure is not None:
            raise self.failure
        if len(self.results) < self.n or (not self.keep and len(self.exited) < self.n):
            raise self._timeout()
        return [self.results[rank] for rank in range(self.n)]

    def _fail(self, rank: int, detail: str) -> None:
        if self.failure is None:
            self.failure = RankFailed(rank, self.n, detail)

    def _read_result(self, conn) -> None:
        rank = self.result_conns.pop(conn)
        try:
            message = conn.recv_bytes(MAX_RESULT_BYTES)
        except (EOFError, OSError) as exc:
            if isinstance(exc, OSError) and "too long" in str(exc):
                self._fail(rank, f"its result is larger than {MAX_RESULT_BYTES // 2**20} MiB")
            return
        kind, body = message[:1], message[1:]
        from course_lib.dist.rank import LAST, RESULT

        if kind not in (RESULT, LAST):
            self._fail(rank, body.decode("utf-8", "replace"))
            return
        self.reusable = self.reusable and kind == RESULT  # LAST: this kept rank serves no further run
        try:
            self.results[rank] = _decode_result(body, self.job.plain_results)
        except Exception as exc:  # noqa: BLE001
            first = str(exc).splitlines()[0] if str(exc) else ""
            self._fail(rank, f"its return value could not be brought back as plain data ({type(exc).__name__}: "
                             f"{first}). Return tensors, numbers, strings, lists, tuples or dicts of those.")

    def _on_exit(self, rank: int) -> None:
        self.exited.add(rank)
        for conn, r in list(self.result_conns.items()):
            if r == rank and conn.poll():  # a result sent just before exiting
                self._read_result(conn)
        self.processes[rank].join(timeout=1)
        code = self.processes[rank].exitcode
        if rank not in self.results:
            how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
            self._fail(rank, f"the rank process {how} without returning a result (os._exit(), a crash, or "
                             "running out of memory). A rank must return; exiting early counts as a failure.")
        elif code != 0:
            self._fail(rank, f"it returned, then its process exited with code {code}")

    def _timeout(self) -> LaunchTimeout:
        done = sorted(self.results)
        stuck = [r for r in range(self.n) if r not in self.results]
        if not stuck:
            stuck = [r for r in range(self.n) if r not in self.exited]
            detail = f"{_ranks(stuck)} returned but did not exit."
        else:
            detail = (f"{_ranks(stuck)} had not returned" + (f" ({_ranks(done).lower()} had)" if done else "") + ". "
                      "The usual cause: a collective that not every rank calls, or that ranks call in a different "
                      "order, waits forever.")
        killed = "the rank was killed" if self.n == 1 else f"all {plural(self.n, 'rank')} were killed"
        return LaunchTimeout(f"timed out after {self.job.timeout:g} s; {killed}.\n"
                             + textwrap.fill(detail, WIDTH))

    def close(self, sweep: bool = True) -> None:
        """Stop the ranks and close the pipes. In a sandbox, `sweep` stops every process in it but its fork server
        (course_lib.dist.warm sweeps once for all the ranks it kept)."""
        for conn in self.job_conns:
            conn.close()
        if sandboxed():  # the pids the fork server reported are the sandbox's: never signal them out here
            if sweep:
                kill_sandbox_processes()
            for process in self.processes:
                process.join(timeout=5)
        else:
            for process in self.processes:
                _kill(process)
        # What the ranks printed before they stopped still belongs in the cell.
        drain_deadline = time.monotonic() + 1.0
        while self.relay.streams and time.monotonic() < drain_deadline:
            for obj in wait(list(self.relay.streams), timeout=max(0.0, drain_deadline - time.monotonic())):
                self.relay.pump(obj)
        self.relay.flush()
        self.relay.close()
        for conn in {**self.result_conns, **self.all_result_conns}:
            conn.close()
        for process in self.processes:
            try:
                process.close()
            except ValueError:
                pass
        if self.scratch is not None:
            self._read_stacks()
            shutil.rmtree(self.scratch, ignore_errors=True)

    def _read_stacks(self) -> None:
        if self.job.dump_stacks_after is None:
            return
        for rank in range(self.n):
            try:
                with open(os.path.join(self.scratch, f"stack-{rank}"), "rb") as handle:
                    text = handle.read(2**16).decode("utf-8", "replace")
            except OSError:
                continue
            if text.strip():
                self.job.stacks[rank] = text
