"""Graded tests for exercise 04 (notebooks/04_collectives.ipynb).

The distributed functions run in 2, 3 and 4 gloo ranks. Every reference is computed here, in the
test process, from inputs this file constructs; the learner's module is only ever loaded in the
ranks. While the learner's code runs, a rank is audited (`_Audit`): the built-in collectives refuse
to run by every route we know of, and every point-to-point message and request is logged, so that the
tests check the algorithm as well as the result: a ring sends one chunk at a time to its right
neighbour, a tree broadcast takes ceil(log2 n) rounds, and every request is waited on.
"""

import math

import pytest
import torch

from course_lib.grading import exception_raised_by, run
from course_lib.nccl_logs import ALL_REDUCE_PERF_LOGS

WORLD_SIZES = [2, 3, 4]
TIMEOUT = 30  # s: a ring with a mismatched send/recv hangs; fail it in time

# Shapes chosen so that the length is below, equal to and not a multiple of the world size.
RING_CASES = [((1,), "float32"), ((2,), "float32"), ((5,), "float32"), ((7,), "int64"),
              ((12,), "float32"), ((1001,), "float32"), ((3, 5), "float32"), ((4, 3), "int64")]
GATHER_CASES = [((1,), "float32"), ((6,), "int64"), ((3, 2), "float32")]
BROADCAST_CASES = [(1,), (5,), (4, 3)]


def make_input(rank: int, shape: tuple, dtype: str, seed: int) -> torch.Tensor:
    """The tensor that `rank` contributes; the test process builds the same ones for its reference."""
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == "int64":
        return torch.randint(-50, 50, shape, generator=generator)
    return torch.randn(shape, generator=generator)


# ---------------------------------------------------------------- the audit inside each rank

# Functions of torch.distributed (and of torch.distributed.distributed_c10d, where they are defined) that
# run a collective: each is replaced by one that refuses, with a message saying what to use instead.
_COLLECTIVE_FUNCTIONS = [
    "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "broadcast_object_list", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_single", "all_gather_object", "_all_gather_base",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "all_to_all",
    "all_to_all_single", "gather", "gather_into_tensor", "gather_single", "gather_object", "scatter",
    "scatter_object_list"]
# Methods of a ProcessGroup (dist.group.WORLD.allreduce(...)) and of its backend object
# (group._get_backend(device).allreduce(...)), which reach the library without any Python function above.
_COLLECTIVE_METHODS = [
    "allreduce", "allreduce_coalesced", "allreduce_sparse", "reduce", "broadcast", "allgather",
    "allgather_coalesced", "allgather_into_tensor_coalesced", "_allgather_base", "all_gather_single",
    "all_gather_single_coalesced", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced", "_reduce_scatter_base", "alltoall", "alltoall_base", "all_to_all_single",
    "gather", "gather_into_tensor", "gather_single", "scatter"]
# The dispatcher's c10d operators that are not collectives; every other c10d operator, and every operator of
# the functional collectives (torch.distributed._functional_collectives), is refused while the audit runs.
_ALLOWED_C10D_OPS = {"c10d::send", "c10d::recv_", "c10d::recv_any_source_", "c10d::barrier", "c10d::monitored_barrier_"}
_P2P_OPS = {"c10d::send", "c10d::recv_", "c10d::recv_any_source_"}


class _Audit:
    """Inside a rank, while the learner's code runs: no built-in collective, and a log of every message.

    Built-in collectives are refused at three levels: the Python functions (dist.all_reduce and the same
    function under torch.distributed.distributed_c10d), the methods of process-group and backend objects,
    and the dispatcher (a TorchDispatchMode sees every c10d operator however it was called, including
    torch.ops.c10d.* and the functional collectives). Point-to-point calls are logged where every route
    passes, the send/recv methods of ProcessGroup and Backend: dist.send, isend, recv, irecv,
    batch_isend_irecv and P2POp all end there. Each returned request is wrapped to note when it is waited
    on. A route that escapes all of this (data passed through the store, say) still has to show up in the
    message log the tests check: a ring that moved no messages did not all-reduce anything.

    log() is plain data for the test: events in program order, each one of
      ["send", peer, elements, request_id, tag]   ["recv", peer or -1 (any source), elements, request_id, tag]
      ["wait", request_id, source]
    and "unwaited" (requests never waited on) and "unlogged" (point-to-point operations the dispatcher saw
    that did not pass the logged methods).
    """

    def __init__(self):
        self.events, self.saved, self.requests, self.waited = [], [], {}, set()
        self.dispatched_p2p, self.logged_p2p, self.mode = 0, 0, None

    # -- bookkeeping
    def _replace(self, owner, name, value):
        self.saved.append((owner, name, owner.__dict__[name] if name in vars(owner) else getattr(owner, name)))
        setattr(owner, name, value)

    def _refuse(self, where):
        def refused(*args, **kwargs):
            raise RuntimeError(f"{where} is switched off in exercise 04: build the collective from point-to-point "
                               "messages (send/recv, isend/irecv, batch_isend_irecv)")
        return refused

    def _logged(self, kind, original, through_group):
        audit = self

        def call(group, tensors, *args):
            # ProcessGroup/Backend: send(tensors, dst, tag), recv(tensors, src, tag), recv_anysource(tensors, tag)
            peer = -1 if kind == "recv_anysource" else args[0]
            tag = args[-1] if args else 0
            numel = sum(t.numel() for t in tensors)
            rid = len(audit.requests)
            audit.events.append(["send" if kind == "send" else "recv", int(peer), int(numel), rid, int(tag)])
            audit.logged_p2p += through_group
            work = original(group, tensors, *args)
            audit.requests[rid] = kind
            return _TrackedWork(audit, work, rid, peer)

        return call

    def _note_wait(self, rid, source):
        if rid not in self.waited:
            self.waited.add(rid)
            self.events.append(["wait", rid, int(source)])

    # -- context manager
    def __enter__(self):
        import torch.distributed as dist
        from torch._C import _distributed_c10d as c10d_classes
        from torch.distributed import distributed_c10d
        from torch.utils._python_dispatch import TorchDispatchMode

        for module in (dist, distributed_c10d):
            for name in _COLLECTIVE_FUNCTIONS:
                if hasattr(module, name):
                    self._replace(module, name, self._refuse(f"{module.__name__}.{name}"))
        for cls in (c10d_classes.ProcessGroup, c10d_classes.Backend):
            for name in _COLLECTIVE_METHODS:
                if hasattr(cls, name):
                    self._replace(cls, name, self._refuse(f"{cls.__name__}.{name}"))
            for kind in ("send", "recv", "recv_anysource"):
                self._replace(cls, kind, self._logged(kind, getattr(cls, kind), cls is c10d_classes.ProcessGroup))
        audit = self

        class Dispatcher(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls):
                return False  # the default wraps this method with torch._dynamo, whose import takes seconds

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func._schema.name
                if name.startswith("_c10d_functional") or (name.startswith("c10d::") and name not in _ALLOWED_C10D_OPS):
                    raise RuntimeError(f"{name} is switched off in exercise 04: build the collective from "
                                       "point-to-point messages")
                audit.dispatched_p2p += name in _P2P_OPS
                return func(*args, **(kwargs or {}))

        self.mode = Dispatcher()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        return False

    def log(self):
        return {"events": self.events, "unwaited": sorted(set(self.requests) - self.waited),
                "unlogged": max(0, self.dispatched_p2p - self.logged_p2p)}


class _TrackedWork:
    """A request returned by send/recv, which notes when it is waited on (or found completed)."""

    def __init__(self, audit, work, rid, peer):
        self._audit, self._work, self._rid, self._peer = audit, work, rid, peer

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self._done()
        return result

    def is_completed(self):
        completed = self._work.is_completed()
        if completed:
            self._done()
        return completed

    def get_future(self, *args, **kwargs):
        self._done()  # whoever takes the future waits on it
        return self._work.get_future(*args, **kwargs)

    def _done(self):
        source = self._peer
        if source == -1:
            try:
                source = self._work._source_rank()
            except Exception:  # noqa: BLE001
                source = -1
        self._audit._note_wait(self._rid, source)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _messages(log, kind):
    """(peer, elements) of every message of one kind in a rank's log; a receive's peer is its actual source."""
    sources = {event[1]: event[2] for event in log["events"] if event[0] == "wait"}
    return [(sources.get(event[3], event[1]) if event[1] == -1 else event[1], event[2])
            for event in log["events"] if event[0] == kind]


def _protocol_problems(log, rank):
    problems = []
    if log["unwaited"]:
        problems.append(f"rank {rank} never waited on {len(log['unwaited'])} of its requests (isend/irecv return a "
                        "request: call wait() before using or changing the tensor, and before returning)")
    if log["unlogged"]:
        problems.append(f"rank {rank} sent or received {log['unlogged']} messages by a route the test cannot see")
    return problems


def rounds_of(logs):
    """The rounds a run took, from every rank's log: one message per round per rank (logical clocks).

    A rank's clock starts at 0; each message it sends costs a round (clock + 1, and the message carries that
    time); a receive, once waited on, moves the clock to at least the time the message carries. Messages
    between two ranks with one tag arrive in the order they were sent. Returns None if the logs do not
    match up (a message received that nobody sent).
    """
    n = len(logs)
    clock, position = [0] * n, [0] * n
    stamps, taken, posted, pending = {}, {}, {}, {}
    progress = True
    while progress:
        progress = False
        for rank in range(n):
            events = logs[rank]["events"]
            while position[rank] < len(events):
                event = events[position[rank]]
                if event[0] == "send":
                    clock[rank] += 1
                    stamps.setdefault((rank, event[1], event[4]), []).append(clock[rank])
                elif event[0] == "recv":
                    key = (event[1], rank, event[4])
                    if event[1] != -1:  # matched in posting order
                        pending[(rank, event[3])] = (key, posted.get(key, 0))
                        posted[key] = posted.get(key, 0) + 1
                    else:
                        pending[(rank, event[3])] = ((None, rank, event[4]), None)
                elif event[0] == "wait" and (rank, event[1]) in pending:
                    key, index = pending[(rank, event[1])]
                    if key[0] is None:  # any source: matched when it completes
                        key = (event[2], rank, key[2])
                        index = taken.get(key, 0)
                        taken[key] = index + 1
                    sent = stamps.get(key, [])
                    if index >= len(sent):
                        break  # its message has not been sent yet in this replay: run the other ranks first
                    clock[rank] = max(clock[rank], sent[index])
                position[rank] += 1
                progress = True
    if any(position[r] < len(logs[r]["events"]) for r in range(n)):
        return None
    return max(clock)


# ---------------------------------------------------------------- ring_all_reduce


def _ring_driver(rank, world_size, module, cases, seed):
    out = []
    for shape, dtype in cases:
        tensor = make_input(rank, shape, dtype, seed)
        before = tensor.clone()
        with _Audit() as audit:
            result = module.ring_all_reduce(tensor)
        out.append({"result": result, "input_unchanged": bool(torch.equal(tensor, before)), "log": audit.log()})
    return out


def _ring_problems(log, rank, n, numel):
    """What in one rank's messages is not a ring all-reduce of `numel` elements over `n` ranks."""
    problems = _protocol_problems(log, rank)
    sends, recvs = _messages(log, "send"), _messages(log, "recv")
    right, left, chunk = (rank + 1) % n, (rank - 1) % n, math.ceil(numel / n)
    if any(peer != right for peer, _ in sends):
        problems.append(f"rank {rank} sent to ranks {sorted({p for p, _ in sends})}; in a ring it sends only to its "
                        f"right neighbour, rank {right}")
    if any(peer != left for peer, _ in recvs):
        problems.append(f"rank {rank} received from ranks {sorted({p for p, _ in recvs})}; in a ring it receives only "
                        f"from its left neighbour, rank {left}")
    for kind, messages in (("sent", sends), ("received", recvs)):
        sizes = [size for _, size in messages]
        if len(sizes) > 2 * (n - 1):
            problems.append(f"rank {rank} {kind} {len(sizes)} messages; a ring all-reduce takes 2(n-1) = {2 * (n - 1)} "
                            "steps of one message each")
        if any(size > chunk for size in sizes):
            problems.append(f"rank {rank} {kind} a message of {max(sizes)} elements; a ring moves one chunk "
                            f"(at most ceil({numel}/{n}) = {chunk} elements) per message")
        low = 2 * (n - 1) * (numel // n)
        if sum(sizes) < low:
            problems.append(f"rank {rank} {kind} {sum(sizes)} elements in all; a ring all-reduce of {numel} elements "
                            f"over {n} ranks moves about 2(n-1)/n of them through every rank (at least {low})")
    return problems


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_all_reduce_sums_along_a_ring(world_size):
    seed = 4 + world_size
    results = run("ex04", _ring_driver, RING_CASES, seed, world_size=world_size, timeout=TIMEOUT)
    for case, (shape, dtype) in enumerate(RING_CASES):
        inputs = [make_input(rank, shape, dtype, seed) for rank in range(world_size)]
        expected = torch.stack(inputs).sum(dim=0)
        for rank in range(world_size):
            got = results[rank][case]
            assert isinstance(got["result"], torch.Tensor), f"rank {rank}: ring_all_reduce must return a tensor"
            torch.testing.assert_close(got["result"], expected,
                                       msg=lambda m: f"{world_size} ranks, shape {shape} {dtype}, rank {rank}: {m}")
            assert got["input_unchanged"], f"{world_size} ranks, shape {shape}: rank {rank} modified its input"
            problems = _ring_problems(got["log"], rank, world_size, math.prod(shape))
            assert not problems, f"{world_size} ranks, shape {shape}: " + "; ".join(problems)
        first = results[0][case]["result"]
        for rank in range(1, world_size):
            assert torch.equal(results[rank][case]["result"], first), (
                f"{world_size} ranks, shape {shape}: rank {rank} got different values from rank 0 "
                "(every rank must end with the same bits, as after the all-gather phase)")


# ---------------------------------------------------------------- tree_broadcast


def _broadcast_driver(rank, world_size, module, shapes, seed):
    out = []
    for src in range(world_size):
        for shape in shapes:
            mine = make_input(rank, shape, "float32", seed)
            tensor = mine.clone() if rank == src else torch.full(shape, float("nan"))
            with _Audit() as audit:
                returned = module.tree_broadcast(tensor, src)
            out.append({"src": src, "tensor": tensor, "returned": returned, "log": audit.log()})
    return out


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_tree_broadcast_copies_the_source_in_log_rounds(world_size):
    seed = 40 + world_size
    results = run("ex04", _broadcast_driver, BROADCAST_CASES, seed, world_size=world_size, timeout=TIMEOUT)
    rounds = math.ceil(math.log2(world_size))
    for index, got in enumerate(results[0]):
        src, shape = got["src"], BROADCAST_CASES[index % len(BROADCAST_CASES)]
        expected = make_input(src, shape, "float32", seed)
        for rank in range(world_size):
            entry = results[rank][index]
            assert entry["src"] == src
            torch.testing.assert_close(entry["tensor"], expected,
                                       msg=lambda m: f"{world_size} ranks, src {src}, rank {rank}: the tensor "
                                                     f"passed in should hold src's values afterwards: {m}")
            torch.testing.assert_close(entry["returned"], expected,
                                       msg=lambda m: f"{world_size} ranks, src {src}, rank {rank}: returned: {m}")
            problems = _protocol_problems(entry["log"], rank)
            assert not problems, f"{world_size} ranks, src {src}: " + "; ".join(problems)
            received = sum(size for _, size in _messages(entry["log"], "recv"))
            assert rank == src or received >= math.prod(shape), (
                f"{world_size} ranks, src {src}: rank {rank} received {received} elements by point-to-point "
                f"messages; src's tensor has {math.prod(shape)}")
            sends = len(_messages(entry["log"], "send"))
            assert sends <= rounds, (
                f"{world_size} ranks, src {src}: rank {rank} sent {sends} messages; along a binomial tree "
                f"no rank sends more than ceil(log2({world_size})) = {rounds}")
        took = rounds_of([results[rank][index]["log"] for rank in range(world_size)])
        assert took is not None, f"{world_size} ranks, src {src}: the ranks' messages do not match up"
        assert took <= rounds, (
            f"{world_size} ranks, src {src}: the data reached the last rank after {took} rounds (one message per "
            f"rank per round); a binomial tree needs ceil(log2({world_size})) = {rounds}")


# ---------------------------------------------------------------- all_gather_p2p


def _gather_driver(rank, world_size, module, cases, seed):
    out = []
    for shape, dtype in cases:
        tensor = make_input(rank, shape, dtype, seed)
        before = tensor.clone()
        with _Audit() as audit:
            gathered = module.all_gather_p2p(tensor)
        out.append({"gathered": list(gathered), "input_unchanged": bool(torch.equal(tensor, before)),
                    "log": audit.log()})
    return out


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_gather_p2p_returns_every_rank_in_order(world_size):
    seed = 400 + world_size
    results = run("ex04", _gather_driver, GATHER_CASES, seed, world_size=world_size, timeout=TIMEOUT)
    for case, (shape, dtype) in enumerate(GATHER_CASES):
        expected = [make_input(r, shape, dtype, seed) for r in range(world_size)]
        for rank in range(world_size):
            got = results[rank][case]
            assert len(got["gathered"]) == world_size, f"rank {rank}: expected a list of {world_size} tensors"
            for source, (tensor, want) in enumerate(zip(got["gathered"], expected)):
                assert torch.equal(tensor, want), (
                    f"{world_size} ranks, shape {shape}: rank {rank}'s entry {source} should be rank {source}'s tensor")
            assert got["input_unchanged"], f"rank {rank} modified its input"
            problems = _protocol_problems(got["log"], rank)
            assert not problems, f"{world_size} ranks, shape {shape}: " + "; ".join(problems)
            received = sum(size for _, size in _messages(got["log"], "recv"))
            assert received >= (world_size - 1) * math.prod(shape), (
                f"rank {rank} received {received} elements; the others' tensors hold "
                f"{(world_size - 1) * math.prod(shape)}")


# ---------------------------------------------------------------- bandwidths

BANDWIDTH_CASES = [
    ("all_reduce", 2**20, 1e-3, 2), ("all_reduce", 2**30, 0.05, 8), ("all_reduce", 4096, 1e-5, 1),
    ("all_gather", 2**26, 0.002, 4), ("reduce_scatter", 3 * 2**20, 1e-3, 3), ("all_to_all", 10**9, 1.0, 16),
    ("broadcast", 2**24, 0.01, 4), ("reduce", 8, 1e-5, 2), ("all_reduce", 0, 1e-5, 4),
]
# Written out here, independently of the exercise: nccl-tests' doc/PERFORMANCE.md.
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}


def _bandwidth_driver(module, cases):
    return [[float(x) for x in module.bandwidths(*case)] for case in cases]


@pytest.mark.points(2)
def test_bandwidths_follow_nccl_tests():
    got = run("ex04", _bandwidth_driver, BANDWIDTH_CASES, timeout=TIMEOUT)
    for (collective, size, seconds, n), (algbw, busbw) in zip(BANDWIDTH_CASES, got):
        want_alg = size / seconds / 1e9
        assert algbw == pytest.approx(want_alg, rel=1e-9), f"{collective}, {size} B in {seconds} s: algbw in GB/s"
        assert busbw == pytest.approx(want_alg * BUS_FACTOR[collective](n), rel=1e-9), (
            f"{collective} over {n} ranks, {size} B in {seconds} s: busbw in GB/s")


def _bad_bandwidth_inputs(module):
    cases = [("all_reduce", 1024, 0.0, 2), ("all_reduce", 1024, -1.0, 2), ("all_reduce", -1, 1.0, 2),
             ("allreduce", 1024, 1.0, 2), ("all_reduce", 1024, 1.0, 0)]
    return [exception_raised_by(module.bandwidths, *args)[0] for args in cases]


@pytest.mark.points(1)
def test_bandwidths_reject_bad_input():
    assert run("ex04", _bad_bandwidth_inputs, timeout=TIMEOUT) == ["ValueError"] * 5


CROSSOVER_CASES = [(1, 5e-6, 1e-11), (2, 5e-6, 1 / 100e9), (3, 5e-6, 1 / 100e9), (4, 5e-6, 1 / 100e9),
                   (5, 1e-5, 1 / 25e9), (6, 2e-6, 1 / 400e9), (8, 5e-6, 1 / 100e9), (9, 5e-6, 1 / 100e9),
                   (64, 2e-6, 1 / 400e9), (1000, 1e-5, 1 / 50e9), (16, 0.0, 1e-9)]


def _ring_seconds(size, n, alpha, beta):
    """The ring of section 5: 2(n-1) steps, each one message of size/n bytes."""
    return 2 * (n - 1) * (alpha + size / n * beta)


def _tree_seconds(size, n, alpha, beta):
    """Reduce up a binomial tree, then broadcast down it: 2 ceil(log2 n) rounds of one whole-tensor message."""
    rounds = 2 * math.ceil(math.log2(n)) if n > 1 else 0
    return rounds * (alpha + size * beta)


def _crossover_driver(module, cases):
    values = [float(module.tree_all_reduce_crossover(*case)) for case in cases]
    bad_cases = [(0, 1e-6, 1e-9), (4, -1e-6, 1e-9), (4, 1e-6, 0.0)]
    outcomes = [exception_raised_by(module.tree_all_reduce_crossover, *args)[0] for args in bad_cases]
    return {"values": values, "bad": outcomes}


@pytest.mark.points(2)
def test_tree_all_reduce_crossover_alpha_beta():
    got = run("ex04", _crossover_driver, CROSSOVER_CASES, timeout=TIMEOUT)
    for (n, alpha, beta), crossover in zip(CROSSOVER_CASES, got["values"]):
        # Both times are linear in the size S: solve tree(S) = ring(S) from their values at 0 and 1 byte.
        gap0 = _tree_seconds(0, n, alpha, beta) - _ring_seconds(0, n, alpha, beta)
        slope = _tree_seconds(1, n, alpha, beta) - _ring_seconds(1, n, alpha, beta) - gap0
        want = -gap0 / slope if gap0 < 0 and slope > 0 else 0.0
        assert crossover == pytest.approx(want, rel=1e-6, abs=1e-9), (
            f"n={n}, alpha={alpha}, beta={beta}: the tree and the ring take equal time at {want:.6g} bytes")
    assert got["bad"] == ["ValueError"] * 3, "world_size < 1, alpha < 0 and beta <= 0 must raise ValueError"


def _factor_driver(module, names, world_sizes):
    table = {name: [float(module.bus_bandwidth_factor(name, n)) for n in world_sizes] for name in names}
    bad_cases = [("allreduce", 4), ("all_reduce", 0), ("send", 2)]
    bad = [exception_raised_by(module.bus_bandwidth_factor, *args)[0] for args in bad_cases]
    return {"table": table, "bad": bad}


@pytest.mark.points(1)
def test_bus_bandwidth_factor_table():
    world_sizes = [1, 2, 3, 4, 8, 64]
    got = run("ex04", _factor_driver, sorted(BUS_FACTOR), world_sizes, timeout=TIMEOUT)
    for name, factors in got["table"].items():
        for n, factor in zip(world_sizes, factors):
            assert factor == pytest.approx(BUS_FACTOR[name](n), rel=1e-12), f"{name} over {n} ranks"
    assert got["bad"] == ["ValueError"] * 3, "unknown collectives and world_size < 1 must raise ValueError"


# ---------------------------------------------------------------- reading nccl-tests' output


def _printed_columns(log):
    """The out-of-place size, time, algbw and busbw columns as all_reduce_perf printed them (these logs' layout)."""
    rows = []
    for line in log.splitlines():
        fields = line.split()
        if len(fields) == 13 and fields[0].isdigit():
            rows.append((int(fields[0]), float(fields[5]), float(fields[6]), float(fields[7])))
    return rows


def _perf_driver(module, logs):
    results = [module.all_reduce_perf_bandwidths(log) for log in logs]
    results = [{"ranks": int(r["ranks"]), "rows": [[float(x) for x in row] for row in r["rows"]]} for r in results]
    try:
        module.all_reduce_perf_bandwidths("# nThread 1 nGpus 1 minBytes 8 maxBytes 8\n# Avg bus bandwidth : 0\n")
        empty = "returned"
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001
        empty = type(exc).__name__
    return {"results": results, "empty": empty}


@pytest.mark.points(2)
def test_all_reduce_perf_bandwidths_agree_with_nccl_tests():
    """The reference is nccl-tests itself: the algbw and busbw columns it printed in real runs."""
    names = list(ALL_REDUCE_PERF_LOGS)
    got = run("ex04", _perf_driver, [ALL_REDUCE_PERF_LOGS[k][0] for k in names], timeout=TIMEOUT)
    for name, result in zip(names, got["results"]):
        log, gpus = ALL_REDUCE_PERF_LOGS[name]
        assert result["ranks"] == gpus, f"{name}: {gpus} GPUs take part (count the device list), not {result['ranks']}"
        printed = _printed_columns(log)
        assert [int(row[0]) for row in result["rows"]] == [row[0] for row in printed], (
            f"{name}: one row per message size, in the order printed")
        for (size, micros, algbw, busbw), (_, want_us, want_alg, want_bus) in zip(result["rows"], printed):
            assert micros == pytest.approx(want_us), f"{name}, {size} B: the out-of-place time is {want_us} us"
            # nccl-tests computed its columns from the unrounded time and printed two decimals.
            for what, value, want in (("algbw", algbw, want_alg), ("busbw", busbw, want_bus)):
                assert abs(value - want) <= 0.005 + 1e-3 * want, (
                    f"{name}, {size} B in {want_us} us: {what} is {want} GB/s as nccl-tests printed it, not {value:.4g}")
    assert got["empty"] == "ValueError", "a log without result rows must raise ValueError"
