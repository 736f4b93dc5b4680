"""Judges forked from one process that imported pytest, Hypothesis and torch once, rather than each importing them.

A judge started as `python -m pytest` spent about 2.2 s of a core importing pytest, Hypothesis, torch and numpy
before collecting its first test (a class grader on 2 cores: that many seconds of every student). The class grader
starts `JudgeZygote` once; it imports those libraries (only third-party ones: pytest must still rewrite the asserts
of the tests, the plugin and course_lib.grading.audits, which it cannot do to a module already imported), then
forks one child per judge. The child takes the judge's session, folder, environment and log as `subprocess.Popen`
would have given them and runs `pytest.main` on the judge's arguments, so that it is the same judge: the sandbox,
its fork server and the ranks all start from the child as before. The grader sees a `ForkedJudge`, which waits and
is killed (as a process group) as a Popen is.

The zygote is started by the grader's main thread and dies with it (Linux's parent-death signal); each judge dies
with the zygote. Where the grader wraps the judge in another program (`--isolation unshare`) it starts it with Popen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from course_lib import stopping

# Imported before the first fork: what every judge imports (measured: the modules a judge holds after collecting the
# course's tests), less pytest's plugins and the course's own modules, whose asserts pytest rewrites on import.
PRELOADS = ("pytest", "hypothesis", "hypothesis.strategies", "numpy", "torch", "torch.distributed",
            "torch.nn.functional", "torch.testing", "cloudpickle", "tqdm")


class ForkedJudge:
    """A judge forked by the zygote: `pid`, `wait(timeout)` and `returncode`, what the grader uses of a Popen."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._done = threading.Event()

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"judge {self.pid}", timeout)
        return self.returncode

    def _exited(self, returncode: int) -> None:
        self.returncode = returncode
        self._done.set()


class JudgeZygote:
    """The process judges are forked from: `start(args, env, cwd, log)` forks one and returns it at once."""

    def __init__(self, env: dict[str, str]):
        self._lock = threading.Lock()
        self._started: list[int] = []
        self._judges: dict[int, ForkedJudge] = {}
        self._reply = threading.Condition()
        self.stopped = ""  # why the zygote no longer forks judges ('' while it does)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "course_lib.instructor.grade.judge_zygote"],
            env={**env, **stopping.dies_with_me()}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=None, start_new_session=True, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read_replies, name="judge zygote", daemon=True)
        self._reader.start()

    def start(self, args: list[str], env: dict[str, str], cwd: Path, log: Path) -> ForkedJudge | None:
        """Fork a judge that runs `pytest args` in `cwd` with exactly `env`, its output into `log`; None once the
        zygote has stopped or stalled (said once on stderr): the grader then starts each judge's Python itself."""
        with self._lock:
            if self.stopped:
                return None
            try:
                return self._fork(args, env, cwd, log)
            except (OSError, RuntimeError) as error:
                self.stopped = str(error) if isinstance(error, RuntimeError) else f"the judge zygote stopped ({error})"
                print(f"WARNING: {self.stopped}; from now on each judge starts Python and imports torch itself",
                      file=sys.stderr, flush=True)
                return None

    def _fork(self, args: list[str], env: dict[str, str], cwd: Path, log: Path) -> ForkedJudge:
        env = {k: v for k, v in env.items() if k != stopping.PARENT_VARIABLE}  # it dies with the zygote instead
        request = {"args": args, "env": env, "cwd": str(cwd), "log": str(log)}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        with self._reply:
            if not self._reply.wait_for(lambda: self._started or self._process.poll() is not None, timeout=120):
                raise RuntimeError("the judge zygote did not fork a judge in 120 s")
            if not self._started:
                raise RuntimeError(f"the judge zygote stopped (exit code {self._process.poll()})")
            return self._judges[self._started.pop(0)]

    def _read_replies(self) -> None:
        for line in self._process.stdout:
            reply = json.loads(line)
            with self._reply:
                if "started" in reply:
                    self._judges[reply["started"]] = ForkedJudge(reply["started"])
                    self._started.append(reply["started"])
                    self._reply.notify_all()
                elif "exited" in reply and reply["exited"] in self._judges:
                    self._judges.pop(reply["exited"])._exited(reply["returncode"])
        with self._reply:  # the zygote is gone: so are its judges (parent-death signal)
            for judge in self._judges.values():
                judge._exited(-9)
            self._judges.clear()
            self._reply.notify_all()

    def close(self) -> None:
        """Stop the zygote (its judges die with it)."""
        try:
            self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


# ------------------------------------------------------------------------------------------- in the zygote


def _judge(request: dict) -> int:
    """(in the forked child) Become the judge Popen would have started, and run pytest."""
    import tempfile

    import pytest

    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # TMPDIR is the student's
    sys.argv = [sys.argv[0], *request["args"]]
    return int(pytest.main(request["args"]))


def _fork(request: dict) -> int:
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        import signal

        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # as a new process has it
        os.environ[stopping.PARENT_VARIABLE] = str(os.getppid())
        stopping.die_with_parent_if_asked()  # the judge dies with the zygote
        _selector.close()
        code = _judge(request)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - said in the judge's log; the grader sees the exit code
        import traceback

        traceback.print_exc()
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()  # what `python -m pytest` runs at its exit (multiprocessing's fork server stop)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


_selector = None  # the zygote's wait for requests (a judge closes its copy)


def main() -> None:
    import selectors
    import signal
    import time

    stopping.die_with_parent_if_asked()
    for module in PRELOADS:
        __import__(module)
    global _selector
    replies = sys.stdout
    children: set[int] = set()
    _selector = selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    open_ = True
    while open_ or children:
        if open_ and selector.select(timeout=0.05):
            line = sys.stdin.readline()
            if not line:
                open_ = False  # the grader is done: wait for the judges still running
                continue
            pid = _fork(json.loads(line))
            children.add(pid)
            replies.write(json.dumps({"started": pid}) + "\n")
            replies.flush()
        elif not open_:
            time.sleep(0.05)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                replies.write(json.dumps({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)}) + "\n")
                replies.flush()


if __name__ == "__main__":
    main()
