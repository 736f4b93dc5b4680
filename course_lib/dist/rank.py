"""What runs inside one rank started by `launch` (notebook 04 explains launching).

This module is preloaded in the fork server together with torch, so a rank starts in
milliseconds instead of re-importing torch for a few seconds.
"""

from __future__ import annotations

import ctypes
import faulthandler
import io
import os
import pickle
import signal
import sys
import tempfile
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
import torch.optim  # noqa: F401 - preloaded in the fork server: the first optimizer step in a rank is then fast

# Preloaded too: the first optimizer a rank builds (or a first op on `meta`) imports torch._dynamo, about 2 s per
# rank otherwise (in the grader's sandbox that made each launch of ex05-ex08 cost 1.4 s instead of 0.2 s). Its import
# makes torch's cache folder (torchinductor_<user>) under $TMPDIR and fails half-way where it cannot (the sandbox's
# fork server is root without CAP_DAC_OVERRIDE and $TMPDIR the student's own folder); a half-imported torch._dynamo
# breaks every later import of it. So where $TMPDIR is not writable, the cache goes to a folder of its own under
# the first temporary folder that is (the sandbox's private /tmp); the ranks get their own environment back anyway.
def _writable_folder(folder: str | None) -> str | None:
    """A new empty folder in `folder` (None: $TMPDIR as torch reads it), or None where none can be made there."""
    try:  # os.access() is not enough: root without CAP_DAC_OVERRIDE passes it and still cannot write
        return tempfile.mkdtemp(prefix="course-preload-", dir=folder)
    except OSError:
        return None


def _preload_dynamo() -> None:
    made = _writable_folder(os.environ.get("TMPDIR") or None)
    if made is not None:
        os.rmdir(made)
        import torch._dynamo  # noqa: F401
        return
    for folder in ("/tmp", "/dev/shm"):
        cache = _writable_folder(folder)
        if cache is None:
            continue
        saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            import torch._dynamo  # noqa: F401
        finally:
            if saved is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
            tempfile.tempdir = None  # a rank reads its own $TMPDIR again
        return


_preload_dynamo()

from course_lib.dist.backend import process_group_backend
from course_lib.dist.sharing_cores import keep_to_one_core, yield_gloo_network_thread

# Messages on the result pipe start with one of these bytes. LAST: a result, after which a kept rank stops serving
# (its run left a thread or a process running, which no later run should meet: course_lib.dist.fresh_state).
RESULT, ERROR, LAST = b"R", b"E", b"L"


@dataclass
class RankOptions:
    """How every rank of one launch is set up; made by the launcher, read by `rank_main`."""

    backend: str | None  # None: no process group
    store_path: str  # the FileStore the ranks meet at
    pg_timeout: float  # seconds before a collective gives up
    threads: int  # torch threads per rank, so ranks do not oversubscribe the cores
    plain_results: bool  # results come back as torch.save data (weights_only) rather than pickles
    env: dict[str, str]  # the launching process's environment at launch time
    confinement: Any = None  # an object whose apply() confines the rank (the grader's policy), or None
    stack_file: str | None = None  # where a rank still running after stack_after seconds writes its stack (+ -rank)
    stack_after: float | None = None
    yield_gloo_network_thread: bool = False  # before each run: yield_gloo_network_thread()
    one_core_per_rank: bool = False  # after the group is made: keep_to_one_core(rank)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the fork server) dies, so a killed kernel leaves none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent's finally still kills the ranks
        pass


def _release_fork_server() -> None:
    """Close this rank's copy of the fork server's "a client is alive" pipe.

    The fork server exits when every holder of that pipe has gone; ranks inherit a
    copy, so without this a killed kernel would leave the fork server, and with it
    the ranks (whose death signal is tied to the fork server), running forever.
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        try:
            os.close(server._forkserver_alive_fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None


def _redirect_output(out_fd: int, err_fd: int) -> None:
    # Redirecting the file descriptors, not just sys.stdout, also catches what C++ (gloo, NCCL) prints.
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)


def to_cpu(value):
    """Tensors returned from a CUDA rank come back on the CPU; containers are walked."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(to_cpu(v) for v in value)
    return value


def encode_result(value, plain: bool) -> bytes:
    value = to_cpu(value)
    if plain:  # loaded with torch.load(weights_only=True): tensors, numbers, strings and containers only
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue()
    return cloudpickle.dumps(value)


def _init_process_group(rank: int, world_size: int, options: RankOptions):
    """Make the default process group; its store (the parent's FileStore), for the barrier at the end."""
    store = dist.FileStore(options.store_path, world_size)
    kwargs = {}
    if options.backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)  # before init: NCCL binds this rank to its own GPU
        kwargs["device_id"] = device
    dist.init_process_group(process_group_backend(options.backend), store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=options.pg_timeout), **kwargs)
    # init_process_group returns on a rank once *its* connections are up, not everyone's: without
    # this barrier a fast rank could finish fn, exit and close its sockets while a slower one is
    # still connecting, which fails the slow rank in gloo's connectFullMesh (seen on a loaded
    # 2-core machine: 6 of 300 four-rank launches of a function without collectives).
    dist.barrier()
    return store


def _leave_together(store, rank: int, world_size: int, timeout: float) -> None:
    """Wait, on the store, until every rank is done with its functions, before tearing any group down.

    The race of init, later: a group the function made (new_group, init_device_mesh) is connected when new_group
    returns on one rank, not on its peers (torch's TORCH_DIST_INIT_BARRIER is off by default). A rank that exited at
    once closed sockets a slow peer was still connecting: "Gloo connectFullMesh failed with [...] Connection closed
    by peer" (lesson 07's 2 × 2 mesh in CI; 5 of 250 launches of it under load before this, 0 of 250 after).
    On the store, not in a collective: a rank whose function raised leaves through here too; one that never comes
    (stuck, killed) costs the others `timeout` at most, once the parent already knows why.
    """
    try:
        store.set(f"course/left/{rank}", b"1")
        store.wait([f"course/left/{r}" for r in range(world_size)], timedelta(seconds=timeout))
    except Exception:  # noqa: BLE001 - a peer that never arrives: tear down anyway
        pass


def _error(rank: int, exc: BaseException) -> bytes:
    """The message that tells the parent why the rank's function (or its set-up) did not return."""
    if isinstance(exc, SystemExit):
        return ERROR + (
            f"rank {rank} called sys.exit({exc.code!r}). A rank must return its result; "
            "exiting early counts as a failure.\n"
        ).encode()
    # Leave out this module's own frame: the traceback starts in the learner's code.
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next or exc.__traceback__)
    return ERROR + "".join(lines).encode("utf-8", "replace")


def _dump_stack_later(rank: int, options: RankOptions, after: float | None) -> None:
    """Write this rank's stack to its file `after` seconds from now, unless cancelled (the grader's loops).

    After apply(): the file is the rank's own user's; "w" empties what an earlier run of a kept rank left.
    faulthandler writes from a C thread of its own, so a loop that never returns to Python's eval loop (a busy
    `while True: pass`) still shows.
    """
    if options.stack_file and after is not None:
        stack = open(f"{options.stack_file}-{rank}", "w")  # noqa: SIM115 - open until the process ends
        faulthandler.dump_traceback_later(max(0.01, after), file=stack)


def _set_up(rank: int, world_size: int, options: RankOptions) -> tuple[bytes | None, Any]:
    """Confine the rank, start the first run's stack timer (its time counts from here: a process group slow to
    form on a loaded machine must not push the dump past the parent's deadline), and make the process group:
    (an error message or None, the store of the group it made or None)."""
    try:
        if options.confinement is not None:
            options.confinement.apply()
        _dump_stack_later(rank, options, options.stack_after)
        if options.backend is not None:
            store = _init_process_group(rank, world_size, options)
            if options.one_core_per_rank:
                keep_to_one_core(rank)
            return None, store
        return None, None
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        return _error(rank, exc), None


def _call(rank: int, world_size: int, payload: bytes, options: RankOptions) -> bytes:
    """Run one function the parent sent; the message for the parent (its result, or why there is none)."""
    try:
        fn, args = cloudpickle.loads(payload)
        if options.yield_gloo_network_thread:
            yield_gloo_network_thread()
        value = fn(rank, world_size, *args)
        if options.stack_file:
            faulthandler.cancel_dump_traceback_later()
        try:
            return RESULT + encode_result(value, options.plain_results)
        except Exception as exc:  # noqa: BLE001
            return ERROR + (
                f"its return value (a {type(value).__name__}) could not be sent back: {type(exc).__name__}: {exc}. "
                "Return tensors, numbers, strings, or lists, tuples and dicts of those.\n"
            ).encode()
    except BaseException as exc:  # noqa: BLE001 - every failure, KeyboardInterrupt included, goes back to the parent
        return _error(rank, exc)


def _send(result_conn, message: bytes) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    result_conn.send_bytes(message)


def _serve(rank: int, world_size: int, job_conn, result_conn, options: RankOptions, fresh) -> None:
    """A kept rank: run each further function the parent sends (pickled: payload, stack_after, whether it starts
    another test) until the parent closes the pipe, or until a run leaves what cannot be put back (LAST)."""
    while True:
        try:
            payload, stack_after, new_test = pickle.loads(job_conn.recv_bytes())
        except (EOFError, OSError):
            return
        _dump_stack_later(rank, options, stack_after)
        fresh.restore(new_test)
        message = _call(rank, world_size, payload, options)
        last = message[:1] == RESULT and not fresh.clean()
        _send(result_conn, LAST + message[1:] if last else message)
        if message[:1] != RESULT or last:
            return


def rank_main(rank: int, world_size: int, payload: bytes, result_conn, out_conn, err_conn,
              options: RankOptions, job_conn=None) -> None:
    """Entry point of one rank: set up, run the user's function, send back its result or its traceback.

    With `job_conn` (a kept rank, course_lib.dist.warm), it then runs each further function the parent sends on
    that pipe, in the same process group, until the parent closes it.
    """
    die_with_parent()
    _release_fork_server()
    os.setsid()  # its own process group: the parent kills the rank and anything it started in one call
    _redirect_output(out_conn.fileno(), err_conn.fileno())
    out_conn.close()
    err_conn.close()
    os.environ.clear()
    os.environ.update(options.env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size))
    # torch reads TORCH_DISTRIBUTED_DEBUG when it is imported, which the fork server did long ago.
    dist.set_debug_level_from_env()
    torch.set_num_threads(options.threads)
    message, store = _set_up(rank, world_size, options)
    if message is None:
        fresh = None
        if job_conn is not None:  # a kept rank: its state before its first run (course_lib.dist.fresh_state)
            from course_lib.dist.fresh_state import FreshState

            fresh = FreshState(options.threads)
        message = _call(rank, world_size, payload, options)
        if fresh is not None and message[:1] == RESULT and not fresh.clean():
            message, fresh = LAST + message[1:], None
        # Report before tearing down: if the others are stuck in a collective, the parent hears of it now.
        _send(result_conn, message)
        if fresh is not None and message[:1] == RESULT:
            _serve(rank, world_size, job_conn, result_conn, options, fresh)
    else:
        _send(result_conn, message)
    if store is not None:
        _leave_together(store, rank, world_size, options.pg_timeout)
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
