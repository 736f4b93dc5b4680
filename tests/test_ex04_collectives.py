"""Graded tests for exercise 04 (notebooks/04_collectives.ipynb).

The distributed functions run in 1 to 5 gloo ranks, on tensors Hypothesis draws: shapes from 0-d to 3-d,
empty ones, sizes that world sizes do not divide, float32, float64, bfloat16 and int64, contiguous or not
(transposed views, every other row of a larger tensor). Every reference is computed here, in the test
process, from inputs this file constructs; the learner's module is only ever loaded in the ranks. While the
learner's code runs, a rank is audited (`_Audit`): the built-in collectives and the store refuse to run by
every route we know of, torch's default device is 'meta' (a buffer not made on the tensor's device shows),
and every point-to-point message and request is logged with its size in elements and bytes, so that the
tests check the algorithm as well as the result: a ring sends one tensor_split chunk at a time to its right
neighbour, 2(n-1)/n of the data in all; a tree broadcast sends n-1 messages in ceil(log2 n) rounds and the
source receives nothing; all_gather_p2p exchanges one message directly with every other rank, all posted
before any wait; every request is waited on.

The pure functions get generated valid and invalid arguments (every invalid one must raise ValueError), and
the log reader gets three real nccl-tests outputs, one in the older layout without a root column.
"""

import math
from collections import Counter

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from course_lib.grading import exception_raised_by, run
from course_lib.nccl_logs import ALL_REDUCE_PERF_LOGS, ONE_MACHINE, OLDER_LAYOUT_LOGS

WORLD_SIZES = [1, 2, 3, 4, 5]
TIMEOUT = 30  # s: a ring with a mismatched send/recv hangs; fail it in time

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "int64": torch.int64}


@st.composite
def tensor_cases(draw):
    """One input of the distributed functions, as plain data: every rank builds its own tensor from it."""
    ndim = draw(st.integers(0, 3))
    shape = draw(st.lists(st.integers(0, 7), min_size=ndim, max_size=ndim))
    layouts = ["contiguous"] + (["every other row"] if ndim >= 1 else []) + (["transposed"] if ndim >= 2 else [])
    return {"shape": shape, "dtype": draw(st.sampled_from(sorted(DTYPES))), "layout": draw(st.sampled_from(layouts)),
            "seed": draw(st.integers(0, 2**16))}


def case(shape, dtype="float32", layout="contiguous", seed=0):
    return {"shape": list(shape), "dtype": dtype, "layout": layout, "seed": seed}


# Always run, before the generated ones: lengths that 2, 3, 4 and 5 do not divide, shorter than the world
# size, 0-d, empty, and every dtype and layout.
FIXED_CASES = [case([7]), case([3, 5], "int64", "transposed", 1), case([], "float64", seed=2),
               case([0, 3], "float32", "every other row", 3), case([5, 2], "bfloat16", "every other row", 4),
               case([2, 3], "bfloat16", "transposed", 5), case([1], "int64", seed=6),
               case([2, 4, 3], "float64", "transposed", 7)]


def make_input(rank: int, spec: dict) -> tuple:
    """(base, tensor): the tensor rank `rank` passes in, and the tensor whose memory it is a view of.

    The values are small integers (-8 to 8), so that sums over 5 ranks are exact in every dtype, bfloat16
    included, whatever the order of the additions. The test process builds the same ones for its reference.
    """
    shape, dtype, layout = tuple(spec["shape"]), DTYPES[spec["dtype"]], spec["layout"]
    generator = torch.Generator().manual_seed(1000 * spec["seed"] + rank)
    if layout == "transposed":  # the same shape, its memory laid out with the last two dimensions swapped
        base = torch.randint(-8, 9, shape[:-2] + (shape[-1], shape[-2]), generator=generator).to(dtype)
        return base, base.transpose(-1, -2)
    if layout == "every other row":  # rows 0, 2, 4, ... of a tensor twice as long
        base = torch.randint(-8, 9, (2 * shape[0],) + shape[1:], generator=generator).to(dtype)
        return base, base[::2]
    base = torch.randint(-8, 9, shape, generator=generator).to(dtype)
    return base, base


def describe_case(spec: dict) -> str:
    return f"a {spec['dtype']} tensor of shape {tuple(spec['shape'])} ({spec['layout']})"


def _numel(spec: dict) -> int:
    return math.prod(spec["shape"])


def _itemsize(spec: dict) -> int:
    return torch.empty((), dtype=DTYPES[spec["dtype"]]).element_size()


def _tensor_info(value):
    """Plain data about what the learner returned: its type, device, dtype, shape, and values if on the CPU."""
    if not isinstance(value, torch.Tensor):
        return {"type": type(value).__name__}
    info = {"type": "Tensor" if type(value) is torch.Tensor else type(value).__name__, "device": value.device.type,
            "dtype": str(value.dtype), "shape": list(value.shape)}
    if value.device.type == "cpu":
        info["values"] = value.detach().clone()
    return info


def _same_memory(a, b) -> bool:
    """Whether two non-empty tensors share memory (the same storage)."""
    return (a.numel() > 0 and b.numel() > 0 and a.device == b.device
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _check_tensor(info, expected, where):
    """Assert that `info` (from _tensor_info) describes `expected`: type, device, dtype, shape and values."""
    assert info["type"] == "Tensor", f"{where}: expected a torch.Tensor, got {info['type']}"
    assert info["device"] == "cpu", (
        f"{where}: the result is on device {info['device']!r}, the input on 'cpu': make every buffer on the "
        "tensor's device (torch.empty_like(t), or device=t.device); the tests set 'meta' as the default device")
    assert info["dtype"] == str(expected.dtype), f"{where}: expected dtype {expected.dtype}, got {info['dtype']}"
    assert info["shape"] == list(expected.shape), f"{where}: expected shape {list(expected.shape)}, got {info['shape']}"
    assert torch.equal(info["values"], expected), f"{where}: expected\n{expected}\ngot\n{info['values']}"


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
# Methods of the process group's key-value store (dist.distributed_c10d._get_default_store() and the like):
# data passed through the store is a message the test cannot count.
_STORE_METHODS = [
    "add", "append", "barrier", "check", "compare_set", "delete_key", "get", "list_keys", "multi_get", "multi_set",
    "num_keys", "queue_len", "queue_pop", "queue_push", "set", "wait"]
# The dispatcher's c10d operators that are not collectives; every other c10d operator, and every operator of
# the functional collectives (torch.distributed._functional_collectives), is refused while the audit runs.
_ALLOWED_C10D_OPS = {"c10d::send", "c10d::recv_", "c10d::recv_any_source_", "c10d::barrier", "c10d::monitored_barrier_"}
_P2P_OPS = {"c10d::send", "c10d::recv_", "c10d::recv_any_source_"}


class _Audit:
    """Inside a rank, while the learner's code runs: no built-in collective, and a log of every message.

    Built-in collectives are refused at three levels: the Python functions (dist.all_reduce and the same
    function under torch.distributed.distributed_c10d), the methods of process-group and backend objects,
    and the dispatcher (a TorchDispatchMode sees every c10d operator however it was called, including
    torch.ops.c10d.* and the functional collectives); so is the process group's key-value store.
    Point-to-point calls are logged where every route passes, the send/recv methods of ProcessGroup and
    Backend: dist.send, isend, recv, irecv, batch_isend_irecv and P2POp all end there; a message whose
    tensor is not on the CPU or not in the input's dtype is refused there (check_tensors). Each returned
    request is wrapped to note when it is waited on. A route that escapes all of this still has to show up
    in the message log the tests check: a ring that moved no messages did not all-reduce anything.

    log() is plain data for the test: events in program order, each one of
      ["send", peer, elements, request_id, tag, bytes]
      ["recv", peer or -1 (any source), elements, request_id, tag, bytes]
      ["wait", request_id, source]
    and "unwaited" (requests never waited on) and "unlogged" (point-to-point operations the dispatcher saw
    that did not pass the logged methods).
    """

    def __init__(self, dtype=None):
        self.events, self.saved, self.requests, self.waited = [], [], {}, set()
        self.dtype = dtype  # the dtype of the tensor the learner was given: every message carries it
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
            audit.check_tensors(kind, tensors)
            peer = -1 if kind == "recv_anysource" else args[0]
            tag = args[-1] if args else 0
            numel = sum(t.numel() for t in tensors)
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            rid = len(audit.requests)
            audit.events.append(["send" if kind == "send" else "recv", int(peer), int(numel), rid, int(tag),
                                 int(nbytes)])
            audit.logged_p2p += through_group
            work = original(group, tensors, *args)
            audit.requests[rid] = kind
            return _TrackedWork(audit, work, rid, peer)

        return call

    def check_tensors(self, kind, tensors):
        """Refuse a message whose tensor is not on the CPU or not in the input's dtype, with a clear reason.

        Unchecked, gloo would pass a 'meta' buffer without moving data (the sender then waits forever) and
        abort the whole rank on a receive buffer of another size in bytes.
        """
        for tensor in tensors:
            if tensor.device.type != "cpu":
                raise RuntimeError(
                    f"a {kind} of a tensor on device {tensor.device.type!r}, where the input is on 'cpu' (while your "
                    "code runs, the tests make 'meta' torch's default device): make every buffer on the tensor's "
                    "device, torch.empty_like(t) or device=t.device")
            if self.dtype is not None and tensor.dtype != self.dtype:
                raise RuntimeError(
                    f"a {kind} of a {tensor.dtype} tensor, where the input is {self.dtype}: send and receive in the "
                    "input's own dtype (torch.empty_like(t), or dtype=t.dtype)")

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
        for name in _STORE_METHODS:
            if hasattr(c10d_classes.Store, name):
                self._replace(c10d_classes.Store, name, self._refuse(f"the process group's store (Store.{name})"))
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
                if name in _P2P_OPS:
                    audit.dispatched_p2p += 1
                    audit.check_tensors(name, [t for t in args[0] if isinstance(t, torch.Tensor)])
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
    """(peer, elements, bytes) of every message of one kind in a rank's log; a receive's peer is its actual source."""
    sources = {event[1]: event[2] for event in log["events"] if event[0] == "wait"}
    return [(sources.get(event[3], event[1]) if event[1] == -1 else event[1], event[2], event[5])
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


def _audited(call, dtype):
    """Run the learner's call() under the audit, with 'meta' as torch's default device: (result, log).

    Every message must carry a tensor of `dtype`, the input's.
    """
    with _Audit(dtype) as audit:
        try:
            with torch.device("meta"):
                result = call()
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - say what the test changed, where it may be the cause
            if "meta" in str(exc) and "default device" not in str(exc):
                raise RuntimeError(f"{type(exc).__name__}: {exc} (while your code runs, the tests make 'meta' torch's "
                                   "default device: make every buffer on the tensor's device, torch.empty_like(t) or "
                                   "device=t.device)") from exc
            raise
    return result, audit.log()


# ---------------------------------------------------------------- ring_all_reduce


def _ring_driver(rank, world_size, module, cases):
    out = []
    for spec in cases:
        base, tensor = make_input(rank, spec)
        before = base.clone()
        result, log = _audited(lambda: module.ring_all_reduce(tensor), tensor.dtype)
        aliased = isinstance(result, torch.Tensor) and (result is tensor or _same_memory(result, base))
        out.append({"result": _tensor_info(result), "input_unchanged": bool(torch.equal(base, before)),
                    "aliased": bool(aliased), "log": log})
    return out


def _chunk_sizes(numel, n):
    """The sizes of torch.tensor_split(flat, n)'s chunks, written out here: the first numel % n get one more."""
    low, extra = divmod(numel, n)
    return [low + 1] * extra + [low] * (n - extra)


def _ring_problems(log, rank, n, numel, itemsize):
    """What in one rank's messages is not a ring all-reduce of `numel` elements over `n` ranks."""
    problems = _protocol_problems(log, rank)
    sends = [m for m in _messages(log, "send") if m[1]]
    recvs = [m for m in _messages(log, "recv") if m[1]]
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = _chunk_sizes(numel, n)
    if any(peer != right for peer, _, _ in sends):
        problems.append(f"rank {rank} sent to ranks {sorted({p for p, _, _ in sends})}; in a ring it sends only to its "
                        f"right neighbour, rank {right}")
    if any(peer != left for peer, _, _ in recvs):
        problems.append(f"rank {rank} received from ranks {sorted({p for p, _, _ in recvs})}; in a ring it receives "
                        f"only from its left neighbour, rank {left}")
    for kind, messages in (("sent", sends), ("received", recvs)):
        sizes = [size for _, size, _ in messages]
        if len(sizes) > 2 * (n - 1):
            problems.append(f"rank {rank} {kind} {len(sizes)} messages; a ring all-reduce takes 2(n-1) = {2 * (n - 1)} "
                            "steps of one message each")
        if any(size not in chunks for size in sizes):
            problems.append(f"rank {rank} {kind} messages of {sorted(set(sizes))} elements; every message is one chunk "
                            f"of torch.tensor_split(flat, {n}): {chunks} elements (no padding, no whole tensors)")
        if any(nbytes != size * itemsize for _, size, nbytes in messages):
            problems.append(f"rank {rank} {kind} messages of {[b for _, _, b in messages]} bytes for "
                            f"{sizes} elements of {itemsize} bytes: send and receive in the tensor's own dtype")
        low, high = 2 * numel - 2 * max(chunks), 2 * numel - 2 * min(chunks)
        if not low <= sum(sizes) <= high:
            problems.append(f"rank {rank} {kind} {sum(sizes)} elements in all; in a ring all-reduce of {numel} "
                            f"elements over {n} ranks every rank sends n-1 chunks in each half, {low} to {high} "
                            "elements, about 2(n-1)/n of the tensor")
    return problems


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@settings(max_examples=3)
@given(cases=st.lists(tensor_cases(), min_size=1, max_size=5))
@example(cases=FIXED_CASES)
def test_ring_all_reduce_sums_along_a_ring(world_size, cases):
    results = run("ex04", _ring_driver, cases, world_size=world_size, timeout=TIMEOUT)
    for index, spec in enumerate(cases):
        where = f"{world_size} ranks, {describe_case(spec)}"
        expected = torch.stack([make_input(rank, spec)[1] for rank in range(world_size)]).sum(dim=0)
        numel, itemsize = _numel(spec), _itemsize(spec)
        for rank in range(world_size):
            got = results[rank][index]
            _check_tensor(got["result"], expected, f"{where}: rank {rank}'s sum")
            assert got["input_unchanged"], f"{where}: rank {rank}'s input was modified; leave it unchanged"
            assert not got["aliased"], (f"{where}: rank {rank} returned its input's memory; return a new tensor "
                                        "(a copy even with one rank)")
            problems = _ring_problems(got["log"], rank, world_size, numel, itemsize)
            assert not problems, f"{where}: " + "; ".join(problems)
        total = sum(size for rank in range(world_size) for _, size, _ in _messages(results[rank][index]["log"], "send"))
        assert total == 2 * (world_size - 1) * numel, (
            f"{where}: the ranks sent {total} elements in all; a ring all-reduce sends every chunk n-1 times in "
            f"the reduce-scatter and n-1 times in the all-gather, 2(n-1) x {numel} = {2 * (world_size - 1) * numel}")


# ---------------------------------------------------------------- tree_broadcast


def _broadcast_driver(rank, world_size, module, cases):
    out = []
    for spec in cases:
        for src in range(world_size):
            base, tensor = make_input(rank, spec)
            returned, log = _audited(lambda: module.tree_broadcast(tensor, src), tensor.dtype)
            out.append({"src": src, "base": base, "returned_is_tensor": returned is tensor, "log": log})
    return out


def _tree_problems(logs, src, n, numel, itemsize):
    """What in the ranks' messages is not a binomial tree broadcast of `numel` elements from `src`."""
    problems = []
    rounds = math.ceil(math.log2(n))
    sent = 0
    for rank, log in enumerate(logs):
        problems += _protocol_problems(log, rank)
        sends = [m for m in _messages(log, "send") if m[1]]
        recvs = [m for m in _messages(log, "recv") if m[1]]
        sent += len(sends)
        if rank == src and recvs:
            problems.append(f"src (rank {src}) received {len(recvs)} messages, from ranks {[p for p, _, _ in recvs]}; "
                            "src already holds the data: a tree that wraps around sends it back")
        if rank != src and numel and len(recvs) != 1:
            problems.append(f"rank {rank} received {len(recvs)} messages; in a broadcast tree every rank but src "
                            "receives src's tensor exactly once")
        for kind, messages in (("sent", sends), ("received", recvs)):
            if any(size != numel or nbytes != numel * itemsize for _, size, nbytes in messages):
                problems.append(f"rank {rank} {kind} messages of {[s for _, s, _ in messages]} elements, "
                                f"{[b for _, _, b in messages]} bytes; src's tensor has {numel} elements of {itemsize} "
                                "bytes (a receive buffer needs the tensor's shape and dtype)")
        if len(sends) > rounds:
            problems.append(f"rank {rank} sent {len(sends)} messages; along a binomial tree no rank sends more than "
                            f"ceil(log2({n})) = {rounds}")
    if numel and sent != n - 1:
        problems.append(f"the ranks sent {sent} messages in all; a tree broadcast sends n-1 = {n - 1}, one to each "
                        "rank but src")
    return problems


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@settings(max_examples=3)
@given(cases=st.lists(tensor_cases(), min_size=1, max_size=4))
@example(cases=FIXED_CASES)
def test_tree_broadcast_copies_the_source_in_log_rounds(world_size, cases):
    results = run("ex04", _broadcast_driver, cases, world_size=world_size, timeout=TIMEOUT)
    rounds = math.ceil(math.log2(world_size))
    index = 0
    for spec in cases:
        numel, itemsize = _numel(spec), _itemsize(spec)
        for src in range(world_size):
            where = f"{world_size} ranks, src {src}, {describe_case(spec)}"
            wanted = make_input(src, spec)[1]
            for rank in range(world_size):
                entry = results[rank][index]
                assert entry["src"] == src
                expected_base, view = make_input(rank, spec)
                view.copy_(wanted)  # in place: src's values in the memory the caller passed in, the rest untouched
                assert torch.equal(entry["base"], expected_base), (
                    f"{where}: rank {rank}'s tensor should hold src's values afterwards, written in place into the "
                    f"memory it was given (copy_ into it, also when it is not contiguous):\nwanted {wanted}")
                assert entry["returned_is_tensor"], (
                    f"{where}: rank {rank} returned a different object; return the tensor it was given")
            logs = [results[rank][index]["log"] for rank in range(world_size)]
            problems = _tree_problems(logs, src, world_size, numel, itemsize)
            assert not problems, f"{where}: " + "; ".join(problems)
            took = rounds_of(logs)
            assert took is not None, f"{where}: the ranks' messages do not match up"
            assert took <= rounds, (
                f"{where}: the data reached the last rank after {took} rounds (one message per rank per round); "
                f"a binomial tree needs ceil(log2({world_size})) = {rounds}")
            index += 1


# ---------------------------------------------------------------- all_gather_p2p


def _gather_driver(rank, world_size, module, cases):
    out = []
    for spec in cases:
        base, tensor = make_input(rank, spec)
        before = base.clone()
        gathered, log = _audited(lambda: module.all_gather_p2p(tensor), tensor.dtype)
        entries = list(gathered) if isinstance(gathered, (list, tuple)) else []
        tensors = [t for t in entries if isinstance(t, torch.Tensor)]
        out.append({"type": type(gathered).__name__, "entries": [_tensor_info(t) for t in entries],
                    "input_unchanged": bool(torch.equal(base, before)),
                    "input_returned": any(t is tensor or _same_memory(t, base) for t in tensors),
                    "shared": any(_same_memory(a, b) for i, a in enumerate(tensors) for b in tensors[i + 1:]),
                    "log": log})
    return out


def _gather_problems(log, rank, n, numel, itemsize):
    """What in one rank's messages is not the direct exchange all_gather_p2p asks for."""
    problems = _protocol_problems(log, rank)
    others = {peer: 1 for peer in range(n) if peer != rank}
    for kind, verb in (("send", "sent"), ("recv", "received")):
        messages = [m for m in _messages(log, kind) if m[1]]
        per_peer = dict(Counter(peer for peer, _, _ in messages))
        if numel and per_peer != others:
            problems.append(
                f"rank {rank} {verb} {per_peer or 'no'} messages (rank: count); all_gather_p2p exchanges directly, "
                f"one message to and one from each other rank ({sorted(others)}), not passing tensors on around a "
                "ring in n-1 dependent steps")
        if any(size != numel or nbytes != numel * itemsize for _, size, nbytes in messages):
            problems.append(f"rank {rank} {verb} messages of {[s for _, s, _ in messages]} elements, "
                            f"{[b for _, _, b in messages]} bytes; each tensor has {numel} elements of {itemsize} "
                            "bytes (receive buffers need the tensor's shape and dtype)")
    events = log["events"]
    posts = [i for i, event in enumerate(events) if event[0] in ("send", "recv")]
    waits = [i for i, event in enumerate(events) if event[0] == "wait"]
    if posts and waits and waits[0] < posts[-1]:
        problems.append(f"rank {rank} waited on a request before it had posted all its sends and receives; post them "
                        "all together (dist.batch_isend_irecv), then wait on every request")
    return problems


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@settings(max_examples=3)
@given(cases=st.lists(tensor_cases(), min_size=1, max_size=5))
@example(cases=FIXED_CASES)
def test_all_gather_p2p_returns_every_rank_in_order(world_size, cases):
    results = run("ex04", _gather_driver, cases, world_size=world_size, timeout=TIMEOUT)
    for index, spec in enumerate(cases):
        where = f"{world_size} ranks, {describe_case(spec)}"
        expected = [make_input(source, spec)[1] for source in range(world_size)]
        for rank in range(world_size):
            got = results[rank][index]
            assert got["type"] == "list", f"{where}: rank {rank}: all_gather_p2p must return a list, not {got['type']}"
            assert len(got["entries"]) == world_size, (
                f"{where}: rank {rank}: expected a list of {world_size} tensors, got {len(got['entries'])} entries")
            for source, (info, want) in enumerate(zip(got["entries"], expected)):
                _check_tensor(info, want, f"{where}: rank {rank}'s entry {source} (rank {source}'s tensor)")
            assert got["input_unchanged"], f"{where}: rank {rank}'s input was modified; leave it unchanged"
            assert not got["input_returned"], (
                f"{where}: rank {rank}'s list holds its input tensor (or a view of it) at index {rank}; every entry "
                "is a new tensor, as dist.all_gather fills, so that changing the list does not change the input")
            assert not got["shared"], f"{where}: rank {rank}'s entries share memory; each needs its own"
            problems = _gather_problems(got["log"], rank, world_size, _numel(spec), _itemsize(spec))
            assert not problems, f"{where}: " + "; ".join(problems)


# ---------------------------------------------------------------- bandwidths

# Written out here, independently of the exercise: nccl-tests' doc/PERFORMANCE.md.
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
COLLECTIVES = sorted(BUS_FACTOR)
UNKNOWN_COLLECTIVES = ["allreduce", "all-reduce", "All_Reduce", "all_reduce ", "allgather", "alltoall", "send",
                       "gather", "scatter", ""]

BANDWIDTH_CASES = [
    ("all_reduce", 2**20, 1e-3, 2), ("all_reduce", 2**30, 0.05, 8), ("all_reduce", 4096, 1e-5, 1),
    ("all_gather", 2**26, 0.002, 4), ("reduce_scatter", 3 * 2**20, 1e-3, 3), ("all_to_all", 10**9, 1.0, 16),
    ("broadcast", 2**24, 0.01, 4), ("reduce", 8, 1e-5, 2), ("all_reduce", 0, 1e-5, 4),
]
valid_bandwidth_cases = st.tuples(st.sampled_from(COLLECTIVES), st.integers(0, 2**40),
                                  st.floats(1e-7, 1e3, allow_nan=False), st.integers(1, 4096))


def _results_of(function, cases):
    """Plain data about function(*case) for each case: the result's type, its items' types and values."""
    out = []
    for args in cases:
        value = function(*args)
        items = list(value) if isinstance(value, (tuple, list)) else [value]
        out.append({"type": type(value).__name__, "item_types": [type(x).__name__ for x in items],
                    "values": [float(x) if isinstance(x, (int, float)) else None for x in items]})
    return out


def _bandwidth_driver(module, cases):
    return _results_of(module.bandwidths, cases)


@pytest.mark.points(2)
@settings(max_examples=5)
@given(cases=st.lists(valid_bandwidth_cases, min_size=1, max_size=8))
@example(cases=BANDWIDTH_CASES)
def test_bandwidths_follow_nccl_tests(cases):
    got = run("ex04", _bandwidth_driver, cases, timeout=TIMEOUT)
    for (collective, size, seconds, n), result in zip(cases, got):
        where = f"bandwidths{(collective, size, seconds, n)}"
        assert result["type"] == "tuple" and result["item_types"] == ["float", "float"], (
            f"{where}: expected a tuple of two floats (algbw, busbw), got a {result['type']} of "
            f"{result['item_types']}")
        algbw, busbw = result["values"]
        want_alg = size / seconds / 1e9
        assert algbw == pytest.approx(want_alg, rel=1e-9), f"{where}: algbw is {want_alg} GB/s, not {algbw}"
        want_bus = want_alg * BUS_FACTOR[collective](n)
        assert busbw == pytest.approx(want_bus, rel=1e-9), f"{where}: busbw is {want_bus} GB/s, not {busbw}"


@st.composite
def bad_bandwidth_cases(draw):
    """A valid (collective, size_bytes, seconds, world_size) with one argument made invalid."""
    collective, size, seconds, n = draw(st.tuples(st.sampled_from(COLLECTIVES), st.sampled_from([0, 1, 4096, 2**30]),
                                                  st.sampled_from([1e-5, 1.0]), st.integers(1, 16)))
    broken = draw(st.sampled_from(["collective", "size_bytes", "seconds", "world_size"]))
    if broken == "collective":
        collective = draw(st.sampled_from(UNKNOWN_COLLECTIVES))
    elif broken == "size_bytes":
        size = draw(st.integers(-2**40, -1))
    elif broken == "seconds":
        seconds = draw(st.sampled_from([0.0, -0.0]) | st.floats(-1e3, -1e-9))
    else:
        n = draw(st.integers(-4, 0))
    return (collective, size, seconds, n)


def _raised_driver(module, function, cases):
    return [exception_raised_by(getattr(module, function), *args) for args in cases]


def _assert_value_errors(function, cases, got, rule):
    for args, (raised, message) in zip(cases, got):
        assert raised == "ValueError", (
            f"{function}{tuple(args)} should raise ValueError ({rule}); it "
            + ("returned" if raised == "returned" else f"raised {raised}: {message}"))


@pytest.mark.points(1)
@settings(max_examples=5)
@given(cases=st.lists(bad_bandwidth_cases(), min_size=1, max_size=8))
@example(cases=[("all_reduce", 1024, 0.0, 2), ("all_reduce", 1024, -1.0, 2), ("all_reduce", -1, 1.0, 2),
                ("allreduce", 1024, 1.0, 2), ("all_reduce", 1024, 1.0, 0), ("all_reduce", 0, 1e-5, 0),
                ("broadcast", 0, 1.0, 0), ("send", 0, 1.0, 2)])
def test_bandwidths_reject_bad_input(cases):
    got = run("ex04", _raised_driver, "bandwidths", cases, timeout=TIMEOUT)
    _assert_value_errors("bandwidths", cases, got, "seconds <= 0, size_bytes < 0, an unknown collective or "
                         "world_size < 1, whatever the other arguments")


def _factor_driver(module, cases):
    return _results_of(module.bus_bandwidth_factor, cases)


@pytest.mark.points(1)
@settings(max_examples=5)
@given(world_sizes=st.lists(st.integers(1, 10**6), min_size=1, max_size=4))
@example(world_sizes=[1, 2, 3, 4, 8, 64])
def test_bus_bandwidth_factor_table(world_sizes):
    cases = [(name, n) for name in COLLECTIVES for n in world_sizes]
    got = run("ex04", _factor_driver, cases, timeout=TIMEOUT)
    for (name, n), result in zip(cases, got):
        assert result["type"] == "float", (
            f"bus_bandwidth_factor({name!r}, {n}) should return a float, not {result['type']}")
        want = BUS_FACTOR[name](n)
        assert result["values"][0] == pytest.approx(want, rel=1e-12), (
            f"bus_bandwidth_factor({name!r}, {n}) is {want}, not {result['values'][0]}")


bad_factor_cases = st.one_of(st.tuples(st.sampled_from(COLLECTIVES), st.integers(-8, 0)),
                             st.tuples(st.sampled_from(UNKNOWN_COLLECTIVES), st.integers(-2, 64)))


@pytest.mark.points(1)
@settings(max_examples=5)
@given(cases=st.lists(bad_factor_cases, min_size=1, max_size=8))
@example(cases=[("allreduce", 4), ("send", 2), *[(name, 0) for name in COLLECTIVES], ("broadcast", -1)])
def test_bus_bandwidth_factor_rejects_bad_input(cases):
    got = run("ex04", _raised_driver, "bus_bandwidth_factor", cases, timeout=TIMEOUT)
    _assert_value_errors("bus_bandwidth_factor", cases, got, "an unknown collective or world_size < 1")


# ---------------------------------------------------------------- the alpha-beta crossover

CROSSOVER_CASES = [(1, 5e-6, 1e-11), (2, 5e-6, 1 / 100e9), (3, 5e-6, 1 / 100e9), (4, 5e-6, 1 / 100e9),
                   (5, 1e-5, 1 / 25e9), (6, 2e-6, 1 / 400e9), (8, 5e-6, 1 / 100e9), (9, 5e-6, 1 / 100e9),
                   (64, 2e-6, 1 / 400e9), (1000, 1e-5, 1 / 50e9), (16, 0.0, 1e-9)]
valid_crossover_cases = st.tuples(st.integers(1, 5000), st.sampled_from([0.0]) | st.floats(1e-7, 1e-3),
                                  st.floats(1e-13, 1e-8))


def _ring_seconds(size, n, alpha, beta):
    """The ring of section 5: 2(n-1) steps, each one message of size/n bytes."""
    return 2 * (n - 1) * (alpha + size / n * beta)


def _tree_seconds(size, n, alpha, beta):
    """Reduce up a binomial tree, then broadcast down it: 2 ceil(log2 n) rounds of one whole-tensor message."""
    rounds = 2 * math.ceil(math.log2(n)) if n > 1 else 0
    return rounds * (alpha + size * beta)


def _crossover_driver(module, cases):
    return _results_of(module.tree_all_reduce_crossover, cases)


@pytest.mark.points(2)
@settings(max_examples=5)
@given(cases=st.lists(valid_crossover_cases, min_size=1, max_size=8))
@example(cases=CROSSOVER_CASES)
def test_tree_all_reduce_crossover_alpha_beta(cases):
    got = run("ex04", _crossover_driver, cases, timeout=TIMEOUT)
    for (n, alpha, beta), result in zip(cases, got):
        where = f"tree_all_reduce_crossover({n}, {alpha}, {beta})"
        assert result["type"] == "float", f"{where} should return a float, not {result['type']}"
        # Both times are linear in the size S: solve tree(S) = ring(S) from their values at 0 and 1 byte.
        gap0 = _tree_seconds(0, n, alpha, beta) - _ring_seconds(0, n, alpha, beta)
        slope = _tree_seconds(1, n, alpha, beta) - _ring_seconds(1, n, alpha, beta) - gap0
        want = -gap0 / slope if gap0 < 0 and slope > 0 else 0.0
        assert result["values"][0] == pytest.approx(want, rel=1e-6, abs=1e-9), (
            f"{where}: the tree and the ring take equal time at {want:.6g} bytes, not {result['values'][0]:.6g}")


@st.composite
def bad_crossover_cases(draw):
    """A valid (world_size, alpha, beta) with one argument made invalid."""
    n, alpha, beta = draw(st.tuples(st.integers(1, 64), st.sampled_from([0.0, 5e-6]), st.sampled_from([1e-11, 1e-9])))
    broken = draw(st.sampled_from(["world_size", "alpha", "beta"]))
    if broken == "world_size":
        n = draw(st.integers(-4, 0))
    elif broken == "alpha":
        alpha = draw(st.floats(-1.0, -1e-12))
    else:
        beta = draw(st.sampled_from([0.0, -0.0]) | st.floats(-1.0, -1e-15))
    return (n, alpha, beta)


@pytest.mark.points(1)
@settings(max_examples=5)
@given(cases=st.lists(bad_crossover_cases(), min_size=1, max_size=8))
@example(cases=[(0, 1e-6, 1e-9), (4, -1e-6, 1e-9), (4, 1e-6, 0.0), (4, 1e-6, -1e-9), (1, 1e-6, -1e-9),
                (2, 0.0, -1e-9), (1, -1e-6, 1e-9), (-3, 0.0, 1e-9)])
def test_tree_all_reduce_crossover_rejects_bad_input(cases):
    got = run("ex04", _raised_driver, "tree_all_reduce_crossover", cases, timeout=TIMEOUT)
    _assert_value_errors("tree_all_reduce_crossover", cases, got,
                         "world_size < 1, alpha < 0 or beta <= 0, also where the answer would be 0.0")


# ---------------------------------------------------------------- reading nccl-tests' output

# name -> (log, GPUs taking part, number of fields in a result row, index of the out-of-place time in it):
# the layout of each log, read off its header here, independently of the exercise.
PERF_LOGS = {**{name: (log, gpus, 13, 5) for name, (log, gpus) in ALL_REDUCE_PERF_LOGS.items()},
             **{name: (log, gpus, 12, 4) for name, (log, gpus) in OLDER_LAYOUT_LOGS.items()}}


def _printed_rows(log, fields_per_row, time_at):
    """(size, out-of-place time in us, algbw, busbw) of every result row, as all_reduce_perf printed them."""
    rows = []
    for line in log.splitlines():
        fields = line.split()
        if len(fields) == fields_per_row and fields[0].isdigit():
            size, micros, algbw, busbw = fields[0], *fields[time_at:time_at + 3]
            rows.append((int(size), float(micros), float(algbw), float(busbw)))
    return rows


def _perf_driver(module, logs, bad_logs):
    results = []
    for log in logs:
        result = module.all_reduce_perf_bandwidths(log)
        rows = result["rows"] if isinstance(result, dict) else None
        results.append({"type": type(result).__name__, "ranks_type": type(result["ranks"]).__name__,
                        "ranks": float(result["ranks"]), "rows_type": type(rows).__name__,
                        "row_types": [[type(x).__name__ for x in row] for row in rows],
                        "rows": [[float(x) for x in row] for row in rows]})
    bad = [exception_raised_by(module.all_reduce_perf_bandwidths, log) for log in bad_logs]
    return {"results": results, "bad": bad}


NO_ROWS = "# nThread 1 nGpus 1 minBytes 8 maxBytes 8\n# Avg bus bandwidth : 0\n"
NO_DEVICES = "\n".join(line for line in ONE_MACHINE.splitlines() if "Rank" not in line) + "\n"
# A device list and a column header, but the run printed no result row (it crashed, or was cut short).
NO_RESULTS = "\n".join(line for line in ONE_MACHINE.splitlines() if line.startswith("#")) + "\n"


@pytest.mark.points(2)
def test_all_reduce_perf_bandwidths_agree_with_nccl_tests():
    """Three real logs, two layouts; the bandwidths computed here from each row's size and printed time."""
    names = list(PERF_LOGS)
    got = run("ex04", _perf_driver, [PERF_LOGS[name][0] for name in names], [NO_ROWS, NO_DEVICES, NO_RESULTS],
              timeout=TIMEOUT)
    for name, result in zip(names, got["results"]):
        log, gpus, fields_per_row, time_at = PERF_LOGS[name]
        assert result["ranks_type"] == "int", f"{name}: 'ranks' should be an int, not a {result['ranks_type']}"
        assert result["ranks"] == gpus, f"{name}: {gpus} GPUs take part (count the device list), not {result['ranks']}"
        assert result["rows_type"] == "list", f"{name}: 'rows' should be a list, not a {result['rows_type']}"
        printed = _printed_rows(log, fields_per_row, time_at)
        assert [int(row[0]) for row in result["rows"]] == [row[0] for row in printed], (
            f"{name}: one row per message size, in the order printed: {[row[0] for row in printed]}")
        for types, (size, micros, algbw, busbw), (_, want_us, printed_alg, printed_bus) in zip(
                result["row_types"], result["rows"], printed):
            where = f"{name}, {size:.0f} B"
            assert types == ["int", "float", "float", "float"], (
                f"{where}: a row is [size_bytes (int), time_us, algbw, busbw (floats)], got types {types}")
            assert micros == pytest.approx(want_us), (
                f"{where}: the out-of-place time is {want_us} us (find its column from the header: older "
                f"nccl-tests print no root column), not {micros}")
            want_alg = size / (want_us * 1e-6) / 1e9
            want_bus = want_alg * 2 * (gpus - 1) / gpus
            # Our reference agrees with what nccl-tests printed, to its two decimals (it used the unrounded time).
            assert abs(want_alg - printed_alg) <= 0.005 + 1e-3 * want_alg, f"{where}: the course's log is corrupt"
            assert abs(want_bus - printed_bus) <= 0.005 + 1e-3 * want_bus, f"{where}: the course's log is corrupt"
            for what, value, want, shown in (("algbw", algbw, want_alg, printed_alg),
                                             ("busbw", busbw, want_bus, printed_bus)):
                assert value == pytest.approx(want, rel=1e-9), (
                    f"{where} in {want_us} us: {what} is {want:.6g} GB/s, computed from the size and time, not "
                    f"{value:.6g}" + (" (the log's column, rounded to two decimals)" if value == shown else ""))
    assert [raised for raised, _ in got["bad"]] == ["ValueError"] * 3, (
        "a log without result rows (with or without a device list and header) and a log without a device list "
        f"must raise ValueError; got {got['bad']}")
