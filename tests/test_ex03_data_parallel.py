"""Graded tests for exercise 03 (notebooks/03_data_parallel.ipynb).

References are computed here, in the test process: torch.chunk / torch.cat, a single-device training step on
the whole batch, a fresh model run on one chunk, torch's consume_prefix_in_state_dict_if_present, and, where
there are two GPUs, torch.nn.parallel's own scatter, gather and replicate.

Besides the results, the tests check the algorithm: devices lists such as ["cpu", "meta", "cpu"] show where each
piece lands (the meta device has shapes and no data), the step's model records every forward call (which object
ran, on how many rows), and a model that sleeps shows whether the replicas ran at the same time.

Generated inputs (Hypothesis, course_lib.grading.properties): batches nesting tensors in dict, OrderedDict,
defaultdict, UserDict, list, tuple and namedtuples, with None, numbers, strings and plain objects beside them;
sizes 0 and 1 and uneven splits; dims 0, 1, -1, -2; integer, bool, fp32, fp64 and bf16 tensors, some laid out
transposed; device lists mixing "cpu" and "meta"; checkpoints with and without the "module." prefix. Each
generated test also checks the postconditions: the type returned, the arguments unchanged (compared, in the
child, with a deep copy taken before the call), and the very same objects where the docstring promises them.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict, UserDict, defaultdict, namedtuple
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.grading import exception_raised_by, run
from course_lib.grading.properties import DTYPES, Triple, describe, device_lists, nested, plain_values

Pair = namedtuple("Pair", ["image", "label"])

# ---------------------------------------------------------------- scatter

SPLITS = [(10, 4), (9, 4), (5, 4), (3, 4), (8, 4), (7, 3), (13, 8), (1, 2), (6, 1)]


def _scatter_tensors(module, splits):
    out = []
    for batch, n in splits:
        x = torch.arange(batch * 2.0).reshape(batch, 2)
        out.append([chunk.clone() for chunk in module.scatter(x, ["cpu"] * n)])
    y = torch.arange(12.0).reshape(2, 6)
    out.append([chunk.clone() for chunk in module.scatter(y, ["cpu"] * 4, dim=1)])
    return out


@pytest.mark.points(2)
def test_scatter_splits_like_data_parallel():
    got = run("ex03", _scatter_tensors, SPLITS)
    cases = [(torch.arange(b * 2.0).reshape(b, 2), n, 0) for b, n in SPLITS] + [(torch.arange(12.0).reshape(2, 6), 4, 1)]
    for (x, n, dim), chunks in zip(cases, got):
        expected = x.chunk(n, dim)  # what torch/csrc/cuda/comm.cpp's scatter uses
        sizes = [c.shape[dim] for c in expected]
        assert isinstance(chunks, list), "return a list with one entry per replica"
        assert [c.shape[dim] for c in chunks] == sizes, (
            f"a batch of {x.shape[dim]} over {n} devices (dim {dim}): DataParallel's chunks have sizes {sizes} "
            f"(torch.chunk: ceil({x.shape[dim]}/{n}) each, so maybe fewer replicas than devices), "
            f"got {[c.shape[dim] for c in chunks]}")
        for want, have in zip(expected, chunks):
            torch.testing.assert_close(have, want)


def _nested_batch():
    return (torch.arange(14.0).reshape(7, 2),
            {"mask": torch.arange(7) % 2 == 0, "name": "batch-0", "ids": [torch.arange(7), 42, None]},
            Pair(torch.ones(7, 3, 2, 2), "cat"),
            SimpleNamespace(scale=2.0))  # a mutable object: DataParallel passes the same one to every replica


def _describe(value):
    if isinstance(value, torch.Tensor):
        return {"tensor": value.device.type, "shape": list(value.shape), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {"dict": [[k, _describe(v)] for k, v in value.items()]}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {type(value).__name__: [_describe(v) for v in value]}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_describe(v) for v in value]}
    return {"value": repr(value)}


def _scatter_nested(module):
    batch = _nested_batch()
    devices = ["cpu", "meta", "cpu"]
    replicas = module.scatter(batch, devices)
    same = [r[1]["name"] is batch[1]["name"] and r[3] is batch[3] and r[2].label is batch[2].label
            for r in replicas]
    values = [r[0].clone() if r[0].device.type == "cpu" else None for r in replicas]
    nothing = {"lr": 0.1}
    no_tensor = module.scatter(nothing, ["cpu"] * 3)
    return {"described": [_describe(r) for r in replicas], "same_objects": same, "values": values,
            "no_tensor": [len(no_tensor), all(r is nothing for r in no_tensor)]}


@pytest.mark.points(2)
def test_scatter_keeps_the_structure_and_shares_non_tensors():
    got = run("ex03", _scatter_nested)
    batch, devices = _nested_batch(), ["cpu", "meta", "cpu"]
    sizes = [3, 3, 1]  # 7 over 3 devices, as torch.chunk splits it

    def expected(value, i):
        if isinstance(value, torch.Tensor):
            start = sum(sizes[:i])
            return value[start:start + sizes[i]].to(devices[i])
        if isinstance(value, dict):
            return {k: expected(v, i) for k, v in value.items()}
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(expected(v, i) for v in value))
        if isinstance(value, (list, tuple)):
            return type(value)(expected(v, i) for v in value)
        return value

    assert len(got["described"]) == 3, "7 rows over 3 devices: 3 replicas"
    for i in range(3):
        assert got["described"][i] == _describe(expected(batch, i)), (
            f"replica {i}: every tensor becomes its chunk on devices[{i}] and every container keeps its type, "
            "keys and order (a namedtuple stays a namedtuple, a tuple a tuple)")
    assert all(got["same_objects"]), "non-tensor values must be the very same objects in every replica, not copies"
    for i, value in enumerate(got["values"]):
        if value is not None:
            torch.testing.assert_close(value, expected(batch, i)[0])
    assert got["no_tensor"] == [3, True], "inputs without a tensor: one reference to them per device"


def _bad_scatters(module):
    return [exception_raised_by(module.scatter, torch.ones(4, 2), []),
            exception_raised_by(module.scatter, torch.ones(0, 2), ["cpu"] * 2),
            exception_raised_by(module.scatter, (torch.ones(4, 2), torch.ones(3)), ["cpu"] * 2)]


@pytest.mark.points(1)
def test_scatter_rejects_what_it_cannot_split_evenly():
    got = run("ex03", _bad_scatters)
    for (kind, _), case in zip(got, ["no devices", "an empty batch", "tensors with batch sizes 4 and 3"]):
        assert kind == "ValueError", f"{case}: expected ValueError, got {kind}"


# ---------------------------------------------------------------- gather

GATHER_CASES = [(0, [(3, 4), (3, 4), (1, 4)]), (0, [(2, 4), (2, 4), (2, 4)]), (1, [(2, 3), (2, 1), (2, 2)])]


def _parts(shapes):
    torch.manual_seed(3)
    return [torch.randn(*s) for s in shapes]


def _gather_flat(module):
    results = []
    for dim, shapes in GATHER_CASES:
        parts = [p.clone().requires_grad_() for p in _parts(shapes)]
        out = module.gather(parts, "cpu", dim=dim)
        weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)
        (out * weights).sum().backward()
        results.append({"out": out.detach().clone(), "grads": [p.grad for p in parts], "type": type(out).__name__})
    return results


@pytest.mark.points(2)
def test_gather_concatenates_in_order_and_keeps_gradients():
    got = run("ex03", _gather_flat)
    for (dim, shapes), result in zip(GATHER_CASES, got):
        parts = _parts(shapes)
        expected = torch.cat(parts, dim)
        assert result["out"].shape == expected.shape, (
            f"gathering outputs of shapes {[tuple(p.shape) for p in parts]} along dim {dim} gives "
            f"{tuple(expected.shape)}, got {tuple(result['out'].shape)} (concatenate, do not stack)")
        torch.testing.assert_close(result["out"], expected)
        weights = torch.arange(expected.numel(), dtype=expected.dtype).reshape(expected.shape)
        for grad, want in zip(result["grads"], weights.split([p.shape[dim] for p in parts], dim)):
            assert grad is not None, "backward through the gathered output must reach every replica's output"
            torch.testing.assert_close(grad, want)
        assert result["type"] == "Tensor", f"gathering tensors returns a plain torch.Tensor, got {result['type']}"


def _gather_nested(module):
    Out = namedtuple("Out", ["logits", "aux"])
    outs = [{"logits": torch.full((2, 3), float(i)), "extra": None, "pair": (torch.tensor(float(i)), torch.ones(2) * i)}
            for i in range(3)]
    gathered = module.gather(outs, "cpu")
    named = module.gather([Out(torch.ones(1, 2) * i, [torch.tensor(i * 1.0)]) for i in range(2)], "cpu")
    return {"logits": gathered["logits"], "extra": gathered["extra"], "pair0": gathered["pair"][0],
            "pair1": gathered["pair"][1], "pair_type": type(gathered["pair"]).__name__,
            "named_type": type(named).__name__, "named_logits": named.logits, "named_aux": named.aux[0],
            "string": exception_raised_by(module.gather, ["a", "b"], "cpu")[0]}


@pytest.mark.points(1)
def test_gather_handles_nested_outputs_and_scalar_losses():
    got = run("ex03", _gather_nested)
    torch.testing.assert_close(got["logits"], torch.cat([torch.full((2, 3), float(i)) for i in range(3)]))
    assert got["extra"] is None, "None stays None"
    torch.testing.assert_close(got["pair0"], torch.tensor([0.0, 1.0, 2.0]),
                               msg="three 0-d outputs (one loss per replica) become a vector of 3")
    torch.testing.assert_close(got["pair1"], torch.cat([torch.ones(2) * i for i in range(3)]))
    assert got["pair_type"] == "tuple" and got["named_type"] == "Out", "containers keep their type"
    torch.testing.assert_close(got["named_logits"], torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    torch.testing.assert_close(got["named_aux"], torch.tensor([0.0, 1.0]))
    assert got["string"] == "TypeError", "outputs that are neither tensors nor containers: TypeError"


# ---------------------------------------------------------------- replicate

def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def _batch(n=9, features=5, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=generator)


def _replicate_grads(module):
    model = _mlp()
    ids_before = [id(p) for p in model.parameters()]
    keys_before = list(model.state_dict())
    values_before = [p.detach().clone() for p in model.parameters()]
    replicas = module.replicate(model, ["cpu"] * 3)
    x = _batch()
    objects = [model] + list(replicas)
    distinct = len({id(m) for m in objects}) == 4
    distinct_children = len({id(dict(m.named_modules())["2"]) for m in objects}) == 4
    with torch.no_grad():
        same_outputs = [torch.equal(r(x), model(x)) for r in replicas]
    for replica, chunk in zip(replicas, x.chunk(3)):
        (replica(chunk) ** 2).sum().backward()
    # The meta device (shapes, no data) shows where a replica's parameters live and whether autograd saw the move.
    # (Not run there: a first computation on "meta" imports torch._dynamo, seconds in each child.)
    on_meta = module.replicate(_mlp(), ["cpu", "meta"])[1]
    weight = on_meta[0].weight
    placed = [weight.device.type, bool(weight.requires_grad and weight.grad_fn is not None)]
    unchanged = ([id(p) for p in model.parameters()] == ids_before and list(model.state_dict()) == keys_before
                 and all(isinstance(p, nn.Parameter) for p in model.parameters())
                 and all(torch.equal(a, b.detach()) for a, b in zip(values_before, model.parameters())))
    return {"count": len(replicas), "distinct": distinct and distinct_children, "same_outputs": same_outputs,
            "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            "placed": placed, "unchanged": unchanged}


@pytest.mark.points(2)
def test_replicate_gives_copies_whose_gradients_come_home():
    got = run("ex03", _replicate_grads)
    assert got["count"] == 3, "one replica per device"
    assert got["distinct"], "each replica (and each of its submodules) must be a separate object: they run in threads"
    assert all(got["same_outputs"]), "a replica must compute exactly what the module computes"
    assert got["unchanged"], "replicate must leave the module as it was: the same Parameters, values and state_dict keys"
    reference = _mlp()
    (reference(_batch()) ** 2).sum().backward()  # the sum over the chunks is the sum over the whole batch
    for (name, param), grad in zip(reference.named_parameters(), got["grads"]):
        assert grad is not None, (f"{name}: backward through the replicas left no gradient in the module: a replica's "
                                  "parameters must be the module's moved with autograd (param.to(device)), not new leaves")
        torch.testing.assert_close(grad, param.grad, msg=f"{name}: the module's gradient must be the sum over replicas")
    device, linked = got["placed"]
    assert device == "meta", (
        f"replicate(model, ['cpu', 'meta']): replica 1's parameters must be on 'meta', found them on {device!r}")
    assert linked, ("replica 1's parameters must be the module's moved with autograd recording the move "
                    "(param.to(device) has a grad_fn), not new leaves")


def _bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6))


def _bn_chunks():
    x = _batch(8, 4, seed=5) + torch.linspace(-2, 2, 8)[:, None]  # chunks with different statistics
    return x[:4], x[4:]


def _replicate_buffers(module):
    model = _bn_model()
    first, second = _bn_chunks()
    replicas = module.replicate(model, ["cpu", "cpu"])
    replicas[0](first)
    replicas[1](second)
    bn, other = model[1], replicas[1][1]
    return {"module": [bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked)],
            "replica1": [other.running_mean.clone(), int(other.num_batches_tracked)]}


@pytest.mark.points(2)
def test_replicate_shares_buffers_with_replica_0_only():
    got = run("ex03", _replicate_buffers)
    first, second = _bn_chunks()
    only_first, only_second = _bn_model(), _bn_model()
    only_first(first)
    only_second(second)
    mean, var, tracked = got["module"]
    assert tracked == 1, (f"the module's BatchNorm saw {tracked} batches: only replica 0's update must reach it "
                          "(0: replica 0 does not share the module's buffers; 2: other replicas share them too)")
    torch.testing.assert_close(mean, only_first[1].running_mean,
                               msg="the module's running mean must come from replica 0's chunk alone")
    torch.testing.assert_close(var, only_first[1].running_var)
    torch.testing.assert_close(got["replica1"][0], only_second[1].running_mean,
                               msg="replica 1 updates its own copy of the buffers")


# ---------------------------------------------------------------- data_parallel_step

def _step_data(batch):
    generator = torch.Generator().manual_seed(7)
    x, shift = torch.randn(batch, 6, generator=generator), torch.randn(batch, 6, generator=generator)
    return x, {"shift": shift, "scale": 0.5}, torch.randint(0, 3, (batch,), generator=generator)


def _step_model():
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


class _StepNet(nn.Module):
    """The step tests' model: two inputs (a tensor, and a dict of a tensor and a number); it records each forward."""

    calls: list = []  # (id of the module object that ran, rows in its input) per forward

    def __init__(self):
        super().__init__()
        self.net = _step_model()

    def forward(self, x, extra):
        _StepNet.calls.append((id(self), x.shape[0]))
        return self.net(x * extra["scale"] + extra["shift"])


class _SGD:
    """SGD with momentum, as torch.optim.SGD computes it, for the child processes: torch.optim's first use imports
    torch._dynamo (seconds in every child). Only what a training step calls: zero_grad() and step()."""

    def __init__(self, params, lr, momentum=0.0):
        self.params, self.lr, self.momentum, self.buffers = list(params), lr, momentum, {}

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self):
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            if self.momentum:
                buf = self.buffers.get(i)
                self.buffers[i] = buf = p.grad.clone() if buf is None else buf.mul_(self.momentum).add_(p.grad)
                p.sub_(self.lr * buf)
            else:
                p.sub_(self.lr * p.grad)


STEP_CASES = [(10, 4), (5, 4), (8, 2)]  # chunks 3,3,3,1 · 2,2,1 (3 of 4 devices used) · 4,4


def _steps(module, cases):
    results = []
    for batch, n in cases:
        model = _StepNet()
        optimizer = _SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, extra, y = _step_data(batch)
        losses, forwards = [], []
        for _ in range(2):
            _StepNet.calls = []
            losses.append(module.data_parallel_step(model, optimizer, (x, extra), y, F.cross_entropy, ["cpu"] * n))
            objects = [who for who, _ in _StepNet.calls]
            forwards.append({"rows": sorted(rows for _, rows in _StepNet.calls),
                             "replicas": len(set(objects)) == len(objects) and id(model) not in objects})
        results.append({"losses": [float(v) for v in losses], "forwards": forwards,
                        "params": [p.detach().clone() for p in model.parameters()]})
    return results


@pytest.mark.points(3)
def test_data_parallel_step_matches_a_single_device_step():
    got = run("ex03", _steps, STEP_CASES)
    for (batch, n), result in zip(STEP_CASES, got):
        where = f"batch {batch} over {n} devices"
        chunks = sorted(len(c) for c in torch.arange(batch).chunk(n))
        for forward in result["forwards"]:
            assert forward["rows"] == chunks, (
                f"{where}: the model must run once per chunk, on chunks of {chunks} rows (DataParallel's split); "
                f"its forward saw {forward['rows']}")
            assert forward["replicas"], (f"{where}: each chunk must run on a replica of its own (from your "
                                         "replicate), never on the model itself")
        model = _StepNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, extra, y = _step_data(batch)
        losses = []
        for _ in range(2):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x, extra), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert result["losses"][0] == pytest.approx(losses[0], rel=1e-5), (
            f"{where}: return the loss of the whole batch, computed once on the gathered output: expected "
            f"{losses[0]:.6f}, got {result['losses'][0]:.6f}")
        for (name, param), have in zip(model.named_parameters(), result["params"]):
            torch.testing.assert_close(have, param.detach(), msg=(
                f"{where}, after 2 steps: {name} differs from a single-device step on the whole batch "
                "(zero the old gradients; compute the loss once on the gathered output; sum, never average)"))
        assert result["losses"] == pytest.approx(losses, rel=1e-5), f"{where}: the second step's loss differs"


class _Slow(nn.Module):
    """A model whose forward sleeps for the largest delay in its chunk, and records when it ran."""

    seen: list = []  # (delay, start, end) per forward call

    def __init__(self):
        super().__init__()
        self.net = _step_model()

    def forward(self, x, delay):
        start = time.perf_counter()
        time.sleep(float(delay.max()))
        out = self.net(x)
        _Slow.seen.append((float(delay.max()), start, time.perf_counter()))
        return out


def _slow_step(module):
    _Slow.seen = []
    model = _Slow()
    optimizer = _SGD(model.parameters(), lr=0.5)
    x, _, y = _step_data(9)
    delay = torch.tensor([0.5] * 3 + [0.2] * 6)  # replica 0 finishes last; every replica takes a while
    module.data_parallel_step(model, optimizer, (x, delay), y, F.cross_entropy, ["cpu"] * 3)
    slow = [(s, e) for d, s, e in _Slow.seen if d > 0.3]
    others = [(s, e) for d, s, e in _Slow.seen if d <= 0.3]
    # Overlapping in time: each fast replica started before the slow one ended, and ended after it started.
    side_by_side = len(slow) == 1 and all(s < slow[0][1] and e > slow[0][0] for s, e in others)
    return {"params": [p.detach().clone() for p in model.net.parameters()],
            "side_by_side": side_by_side, "calls": len(_Slow.seen)}


@pytest.mark.points(1)
def test_data_parallel_step_runs_replicas_in_threads_and_keeps_their_order():
    got = run("ex03", _slow_step)
    assert got["calls"] == 3, f"3 chunks, so 3 replica forwards; got {got['calls']}"
    assert got["side_by_side"], ("replica 0 takes 0.5 s and replicas 1 and 2 take 0.2 s, but they did not run at the "
                                 "same time: run each replica in a thread of its own, all started before any is joined")
    model = _step_model()
    x, _, y = _step_data(9)
    F.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.5 * p.grad
    for param, have in zip(model.parameters(), got["params"]):
        torch.testing.assert_close(have, param.detach(), msg=(
            "after the step the parameters differ from a single-device step on the whole batch; replica 0 finished "
            "last here, so outputs gathered in the order the threads finish, not in replica order, would do this"))


# ---------------------------------------------------------------- adapt_state_dict

class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.submodule = nn.Linear(4, 4)   # "module." inside a name is not the wrapper's
        self.norm = nn.BatchNorm1d(4)
        self.module = nn.Linear(4, 2)      # nor is a child that happens to be called "module"

    def forward(self, ids):
        return self.module(self.norm(self.submodule(self.embed(ids))))


def _adapt(module):
    torch.manual_seed(0)
    plain = _Net()
    wrapped = nn.DataParallel(_Net())  # on a machine without GPUs it just holds the model as .module
    results = {}
    for name, checkpoint, target in [("wrapped -> plain", wrapped.state_dict(), plain),
                                     ("plain -> wrapped", plain.state_dict(), wrapped),
                                     ("plain -> plain", plain.state_dict(), plain),
                                     ("wrapped -> wrapped", wrapped.state_dict(), wrapped)]:
        adapted = module.adapt_state_dict(checkpoint, target)
        same_values = all(a is b for a, b in zip(adapted.values(), checkpoint.values()))
        try:
            target.load_state_dict(adapted, strict=True)
            loads = "ok"
        except Exception as exc:  # noqa: BLE001
            loads = f"{type(exc).__name__}: {str(exc)[:200]}"
        results[name] = {"keys": list(adapted.keys()), "same_values": same_values, "loads": loads}
    return results


@pytest.mark.points(2)
def test_adapt_state_dict_strips_or_adds_only_the_wrapper_prefix():
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    got = run("ex03", _adapt)
    plain_keys = list(_Net().state_dict())
    stripped = OrderedDict(nn.DataParallel(_Net()).state_dict())
    consume_prefix_in_state_dict_if_present(stripped, "module.")  # torch's own way to strip it
    expected = {"wrapped -> plain": list(stripped), "plain -> wrapped": ["module." + k for k in plain_keys],
                "plain -> plain": plain_keys, "wrapped -> wrapped": ["module." + k for k in plain_keys]}
    for case, want in expected.items():
        result = got[case]
        assert result["keys"] == want, f"{case}: expected keys {want[:5]}..., got {result['keys'][:5]}..."
        assert result["loads"] == "ok", f"{case}: load_state_dict(strict=True) failed: {result['loads']}"
        assert result["same_values"], f"{case}: keep the very same tensors (no copies), in the same order"


class _Other(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 4)


def _foreign(module):
    return [exception_raised_by(module.adapt_state_dict, _Other().state_dict(), _Net()),
            exception_raised_by(module.adapt_state_dict, nn.DataParallel(_Net()).state_dict(), _Other())]


@pytest.mark.points(1)
def test_adapt_state_dict_names_a_key_that_does_not_fit():
    for kind, message in run("ex03", _foreign):
        assert kind == "KeyError", f"a checkpoint of another model: expected KeyError, got {kind}"
        assert any(k in message for k in ["embed", "submodule", "norm", "module.weight", "encoder"]), (
            f"the message should name a key that does not fit: {message!r}")


# ---------------------------------------------------------------- on two GPUs: against torch.nn.parallel itself

def _against_torch_on_gpus(module):
    from torch.nn.parallel import gather, replicate, scatter

    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    batch = (torch.randn(7, 3), {"m": torch.arange(7)})
    mine, theirs = module.scatter(batch, devices), scatter(batch, [0, 1])
    scatter_ok = all(torch.equal(a[0], b[0]) and a[0].device == b[0].device and torch.equal(a[1]["m"], b[1]["m"])
                     for a, b in zip(mine, theirs))
    outs = [torch.randn(3, 2, device="cuda:0"), torch.randn(4, 2, device="cuda:1")]
    gather_ok = torch.equal(module.gather(outs, devices[0]), gather(outs, 0))
    model = _step_model().to(devices[0])
    x = torch.randn(8, 6, device="cuda:0")
    mine_r, theirs_r = module.replicate(model, devices), replicate(model, [0, 1])
    replicate_ok = all(torch.allclose(a(x.to(d)), b(x.to(d))) for a, b, d in zip(mine_r, theirs_r, devices))
    return [scatter_ok, gather_ok, replicate_ok]


@pytest.mark.gpu(2)
@pytest.mark.points(1)
def test_scatter_gather_replicate_agree_with_torch_on_two_gpus():
    assert run("ex03", _against_torch_on_gpus) == [True, True, True], (
        "[scatter, gather, replicate] must match torch.nn.parallel's on cuda:0 and cuda:1")


def _gpu_step(module):
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    model = _StepNet().to(devices[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, extra, y = _step_data(10)
    for _ in range(2):  # a CPU batch, as a data loader gives it: scatter copies each chunk to its GPU
        module.data_parallel_step(model, optimizer, (x, extra), y.to(devices[0]), F.cross_entropy, devices)
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.gpu(2)
@pytest.mark.points(2)
def test_data_parallel_step_on_two_gpus_matches_one_device():
    got = run("ex03", _gpu_step)
    model = _StepNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, extra, y = _step_data(10)
    for _ in range(2):
        optimizer.zero_grad()
        F.cross_entropy(model(x, extra), y).backward()
        optimizer.step()
    for param, have in zip(model.parameters(), got):
        torch.testing.assert_close(have, param.detach(), rtol=1e-4, atol=1e-5)  # GPU arithmetic (TF32 off by default) vs CPU


# ---------------------------------------------------------------- generated inputs (Hypothesis), with postconditions
# Plain-Python walks shared by the drivers (they travel to the child by value) and by the references.

def _is_namedtuple(value):
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _is_mapping(value):
    return isinstance(value, (dict, UserDict))


def _rebuild(value, leaf):
    """`value` with every non-container replaced by leaf(it); containers rebuilt with their very type."""
    if isinstance(value, defaultdict):
        return defaultdict(value.default_factory, [(k, _rebuild(v, leaf)) for k, v in value.items()])
    if _is_mapping(value):
        return type(value)([(k, _rebuild(v, leaf)) for k, v in value.items()])
    if _is_namedtuple(value):
        return type(value)(*(_rebuild(v, leaf) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(v, leaf) for v in value)
    return leaf(value)


def _leaves(value):
    """Every non-container in `value`, depth first, in order."""
    if _is_mapping(value):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return [value]


def _tensors(value):
    return [x for x in _leaves(value) if isinstance(x, torch.Tensor)]


def _values(value):
    """The tensors in `value`, in order: CPU ones as plain copies, meta ones (no data) as None."""
    return [t.detach().clone() if t.device.type == "cpu" else None for t in _tensors(value)]


def _same(a, b):
    """Deep equality of two nested values: types, keys and order, tensors' device, dtype, shape and values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
                and (a.device.type == "meta" or torch.equal(a, b)))
    if isinstance(a, defaultdict) and a.default_factory is not b.default_factory:
        return False
    if _is_mapping(a):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _sharing(original, replica):
    """'' if every non-tensor leaf of `replica` is the very object of `original` (and defaultdicts keep their
    default_factory), else what differs. Containers themselves are new in each replica."""
    if isinstance(original, defaultdict) and getattr(replica, "default_factory", None) is not original.default_factory:
        return "a defaultdict lost its default_factory"
    if _is_mapping(original) and _is_mapping(replica):
        if list(original) != list(replica):
            return f"keys {list(original)} became {list(replica)}"
        return next((why for k in original if (why := _sharing(original[k], replica[k]))), "")
    if isinstance(original, (list, tuple)) and isinstance(replica, (list, tuple)):
        if len(original) != len(replica):
            return f"a {type(original).__name__} of {len(original)} became one of {len(replica)}"
        return next((why for x, y in zip(original, replica) if (why := _sharing(x, y))), "")
    if isinstance(original, torch.Tensor):
        return "" if isinstance(replica, torch.Tensor) else f"a tensor became {type(replica).__name__}"
    return "" if replica is original else f"{original!r} was copied: it must be the very same object"


def _raised(function, *args):
    """(None, result), or (exception class name, message) if `function(*args)` raised; NotImplementedError passes."""
    try:
        return None, function(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the test says what was expected
        return f"{type(exc).__name__}: {str(exc)[:300]}", None


@st.composite
def _tensor_along(draw, rows, dim, dtypes=DTYPES):
    """A tensor of 1 to 3 dimensions with `rows` entries along `dim` (others 0 to 3), maybe laid out transposed."""
    need = dim + 1 if dim >= 0 else -dim
    shape = draw(st.lists(st.integers(0, 3), min_size=max(need, 1), max_size=3))
    shape[dim] = rows
    dtype = draw(st.sampled_from(dtypes))
    values = torch.randint(-8, 9, shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 2**16))))
    tensor = (values > 0) if dtype is torch.bool else values.to(dtype)
    if len(shape) >= 2 and draw(st.booleans()):
        tensor = tensor.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, non-contiguous
    return tensor


DIMS = [0, 1, -1, -2]


@st.composite
def _scatter_cases(draw):
    devices = draw(device_lists(1, 5))
    dim = draw(st.sampled_from(DIMS))
    rows = draw(st.integers(0, 9))  # 0: nothing to split (ValueError); 1: one replica; uneven splits
    batch = draw(nested(st.one_of(_tensor_along(rows, dim), plain_values())))
    return batch, devices, dim


def _all_containers_batch(rows=7):
    """Every container kind at once, for the first (explicit) example of the generated tests."""
    x = torch.arange(rows * 6.0).reshape(3, rows, 2).transpose(0, 1)  # rows along dim 0, non-contiguous
    return OrderedDict(image=x, meta=defaultdict(list, ids=[torch.arange(rows), None], tag="a"),
                       extra=UserDict(mask=torch.arange(rows) % 2 == 0, obj=SimpleNamespace(scale=1.5)),
                       pair=Triple(torch.ones(rows, dtype=torch.bfloat16), 3, (torch.zeros(rows, 1, dtype=torch.int64),)))


def _scatter_generated(module, cases):
    results = []
    for batch, devices, dim in cases:
        before = copy.deepcopy(batch)
        error, replicas = _raised(module.scatter, batch, devices, dim)
        result = {"error": error, "unchanged": _same(before, batch), "type": type(replicas).__name__}
        if error is None and isinstance(replicas, list):
            result.update(described=[describe(r) for r in replicas], values=[_values(r) for r in replicas],
                          sharing=[_sharing(batch, r) for r in replicas], is_input=[r is batch for r in replicas])
        results.append(result)
    return results


@pytest.mark.points(3)
@settings(max_examples=8)
@given(cases=st.lists(_scatter_cases(), min_size=1, max_size=4))
@example(cases=[(_all_containers_batch(), ["cpu", "meta", "cpu"], 0),
                (_rebuild(_all_containers_batch(5), lambda v: v.movedim(0, -1) if isinstance(v, torch.Tensor) else v),
                 ["cpu", "meta"], -1)])
def test_scatter_splits_generated_batches_like_torch_chunk(cases):
    got = run("ex03", _scatter_generated, cases)
    for (batch, devices, dim), result in zip(cases, got):
        where = f"scatter(batch, {devices}, dim={dim}) with batch = {batch!r}"
        assert result["unchanged"], f"{where}: scatter must not change its input"
        tensors = _tensors(batch)
        if any(t.shape[dim] == 0 for t in tensors):
            assert result["error"] and result["error"].startswith("ValueError"), (
                f"{where}: a tensor is empty along dim {dim}: expected ValueError, got {result['error'] or 'a result'}")
            continue
        assert result["error"] is None, f"{where}: raised {result['error']}"
        assert result["type"] == "list", f"{where}: return a list, got {result['type']}"
        if not tensors:
            assert result["is_input"] == [True] * len(devices), (
                f"{where}: no tensor to split: expected {len(devices)} references to the input itself")
            continue
        n = len(tensors[0].chunk(len(devices), dim))  # torch.chunk's count: maybe fewer replicas than devices
        expected = [_rebuild(batch, lambda v, i=i: v.chunk(len(devices), dim)[i].to(devices[i])
                             if isinstance(v, torch.Tensor) else v) for i in range(n)]
        assert len(result["described"]) == n, (
            f"{where}: {tensors[0].shape[dim]} along dim {dim} over {len(devices)} devices: torch.chunk makes {n} "
            f"chunks, so {n} replicas; got {len(result['described'])}")
        for i, (want, have) in enumerate(zip(expected, result["described"])):
            assert have == describe(want), (
                f"{where}: replica {i} should be {describe(want)} (each tensor its chunk along dim {dim} on "
                f"devices[{i}], every container of its very type), got {have}")
            assert result["sharing"][i] == "", f"{where}: replica {i}: {result['sharing'][i]}"
            for a, b in zip(result["values"][i], _tensors(want)):
                if a is not None:
                    torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{where}: replica {i}'s values")


def _bad_dims(module):
    x = torch.arange(12.0).reshape(4, 3)
    cases = [(x, 2), (x, -3), (torch.tensor(1.0), 0), ({"x": x, "loss": torch.tensor(2.0)}, 0),
             ([x, torch.ones(4)], 1), ((x, torch.ones(4, 2)), 1), ((x, torch.zeros(4, 0)), -1)]
    return [exception_raised_by(module.scatter, batch, ["cpu"] * 2, dim) for batch, dim in cases]


@pytest.mark.points(1)
def test_scatter_rejects_dims_it_cannot_split_along():
    got = run("ex03", _bad_dims)
    cases = ["dim 2 of a 4x3 tensor (out of range)", "dim -3 of a 4x3 tensor (out of range)", "a 0-d tensor",
             "a 0-d tensor (a loss) beside a batch, in a dict", "dim 1 of a 1-d tensor beside a 4x3 one",
             "dim 1: sizes 3 and 2", "dim -1: a tensor empty along it"]
    for (kind, message), case in zip(got, cases):
        assert kind == "ValueError", (f"scatter of {case}: expected ValueError (the docstring's promise; torch's "
                                      f"own IndexError is not it), got {kind}: {message}")


def _all_containers_output(i, rows):
    """Replica i's output with every container kind, for the first (explicit) example of the gather test."""
    logits = torch.arange(rows * 3.0).reshape(3, rows).t() + 10 * i  # non-contiguous
    return OrderedDict(logits=logits, aux=defaultdict(list, loss=torch.tensor(float(i)), nothing=None),
                       extra=UserDict(mask=torch.arange(rows) % 2 == 0),
                       pair=Triple(torch.full((rows,), i, dtype=torch.bfloat16), None, (torch.ones(rows, 1, dtype=torch.int64),)))


class _Parts:
    """A leaf of a generated gather case: the tensors (one per replica) that sit at this place in each output."""

    def __init__(self, parts):
        self.parts = parts

    def __repr__(self):
        return f"<parts of shapes {[tuple(p.shape) for p in self.parts]}, {self.parts[0].dtype}>"


@st.composite
def _gather_parts(draw, n, dim):
    if dim == 0 and draw(st.integers(0, 4)) == 0:  # one 0-d tensor per replica: a loss each
        dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64]))
        return _Parts([torch.tensor(draw(st.integers(-5, 5)), dtype=dtype) for _ in range(n)])
    template = draw(_tensor_along(1, dim))
    parts = []
    for _ in range(n):
        shape = list(template.shape)
        shape[dim] = draw(st.integers(0, 3))  # 0 rows from a replica is fine for torch.cat
        values = torch.randint(-8, 9, shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 999))))
        parts.append((values > 0) if template.dtype is torch.bool else values.to(template.dtype))
    return _Parts(parts)


@st.composite
def _gather_cases(draw):
    # All on the CPU: torch.cat on "meta" tensors imports torch._dynamo (seconds) in each child process, so
    # mixed devices are the explicit test below, in a single child.
    n = draw(st.integers(1, 4))
    where, target = ["cpu"] * n, "cpu"
    dim = draw(st.sampled_from(DIMS))
    skeleton = draw(nested(st.one_of(st.none(), _gather_parts(n, dim))))
    outputs = [_rebuild(skeleton, lambda v, i=i: v.parts[i] if isinstance(v, _Parts) else v) for i in range(n)]
    return outputs, where, target, dim, skeleton


def _gather_generated(module, cases):
    results = []
    for outputs, where, target, dim in cases:
        outputs = [_rebuild(out, lambda v, d=d: v.to(d) if isinstance(v, torch.Tensor) else v)
                   for out, d in zip(outputs, where)]
        before = copy.deepcopy(outputs)
        error, gathered = _raised(module.gather, outputs, target, dim)
        results.append({"error": error, "unchanged": _same(before, outputs), "described": describe(gathered),
                        "values": _values(gathered) if error is None else []})
    return results


def _gather_reference(skeleton, target, dim):
    def cat(v):
        if not isinstance(v, _Parts):
            return v
        parts = [p.reshape(1) if p.dim() == 0 else p for p in v.parts]
        return torch.cat(parts, dim).to(target)
    return _rebuild(skeleton, cat)


def _check_gathers(cases):
    cases = [(outs, where, target, dim, skeleton if skeleton is not None else _skeleton_of(outs))
             for outs, where, target, dim, skeleton in cases]
    got = run("ex03", _gather_generated, [case[:4] for case in cases])
    for (outputs, where, target, dim, skeleton), result in zip(cases, got):
        case = f"gather(outputs, {target!r}, dim={dim}) of outputs on {where}: {skeleton!r}"
        assert result["error"] is None, (f"{case}: raised {result['error']} (move each replica's tensors to the "
                                         "target device first, then concatenate)")
        assert result["unchanged"], f"{case}: gather must not change the replicas' outputs"
        expected = _gather_reference(skeleton, target, dim)
        assert result["described"] == describe(expected), (
            f"{case}: expected {describe(expected)} (tensors concatenated along dim {dim} on {target!r}, 0-d ones "
            f"as a vector, containers of their very type), got {result['described']}")
        for have, want in zip(result["values"], _tensors(expected)):
            if have is not None:
                torch.testing.assert_close(have, want, rtol=0, atol=0, msg=f"{case}: values differ")


@pytest.mark.points(2)
@settings(max_examples=6)
@given(cases=st.lists(_gather_cases(), min_size=1, max_size=4))
@example(cases=[([_all_containers_output(i, rows) for i, rows in enumerate([2, 0, 1])], ["cpu"] * 3, "cpu", 0, None)])
def test_gather_concatenates_generated_outputs(cases):
    _check_gathers(cases)


def _outputs(rows):
    return [_all_containers_output(i, r) for i, r in enumerate(rows)]


@pytest.mark.points(2)
def test_gather_moves_each_part_to_the_target_device_first():
    """Replicas' outputs on "cpu" and "meta" (a second device), gathered onto "meta": torch.cat refuses tensors
    on two devices, so a gather that concatenates first and moves afterwards raises here."""
    _check_gathers([(_outputs([2, 3, 1]), ["cpu", "meta", "cpu"], "meta", 0, None),
                    (_outputs([1, 2]), ["meta", "cpu"], "meta", 0, None),
                    ([torch.ones(2, 3), torch.zeros(2, 1)], ["cpu", "meta"], "meta", -1, None),
                    (_outputs([2, 2]), ["cpu", "cpu"], "meta", 0, None)])


def _skeleton_of(outputs):
    """The _Parts skeleton of hand-written outputs (the explicit example): each tensor's parts over the replicas."""
    columns = [_leaves(out) for out in outputs]
    it = iter(zip(*columns))

    def leaf(value):
        column = next(it)
        return _Parts(list(column)) if isinstance(value, torch.Tensor) else value
    return _rebuild(outputs[0], leaf)


class _Buffers(nn.Module):
    """Parameters (one of them None), BatchNorm's buffers, a non-persistent buffer and a None one."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 6, bias=False)
        self.norm = nn.BatchNorm1d(6)
        self.register_buffer("scale", torch.full((6,), 2.0), persistent=False)
        self.register_buffer("unused", None)

    def forward(self, x):
        return self.norm(self.proj(x)) * self.scale


def _tensors_by_name(model, kind):
    """[(qualified name, submodule name, attribute)] of a module's parameters or buffers, None ones left out."""
    return [(f"{name}.{key}".lstrip("."), name, key) for name, sub in model.named_modules()
            for key, value in getattr(sub, kind).items() if value is not None]


def _replicate_places(module, lists):
    results = []
    for devices in lists:
        torch.manual_seed(0)
        model = _Buffers()
        before = copy.deepcopy(model)
        params, buffers = list(model.parameters()), list(model.buffers())
        error, replicas = _raised(module.replicate, model, devices)
        unchanged = (len(list(model.parameters())) == len(params) and all(a is b for a, b in zip(model.parameters(), params))
                     and all(a is b for a, b in zip(model.buffers(), buffers)) and len(list(model.buffers())) == len(buffers)
                     and _same(dict(before.state_dict()), dict(model.state_dict())) and _same(before.scale, model.scale))
        result = {"error": error, "unchanged": unchanged, "type": type(replicas).__name__, "replicas": []}
        for replica in (replicas if isinstance(replicas, list) else []):
            places = {}
            for kind in ["_parameters", "_buffers"]:
                for qualified, name, key in _tensors_by_name(model, kind):
                    value = getattr(replica.get_submodule(name), key, None)
                    original = getattr(model.get_submodule(name), key)
                    places[qualified] = {"device": value.device.type if isinstance(value, torch.Tensor) else repr(value),
                                         "original": value is original,
                                         "shares": bool(isinstance(value, torch.Tensor) and value.device.type == "cpu"
                                                        and value.data_ptr() == original.data_ptr())}
            result["replicas"].append(places)
        results.append(result)
    return results


@pytest.mark.points(2)
@settings(max_examples=4)
@given(lists=st.lists(device_lists(0, 3).map(lambda rest: ["cpu"] + rest), min_size=1, max_size=3))
@example(lists=[["cpu", "meta"], ["cpu", "meta", "cpu", "meta"]])
def test_replicate_puts_parameters_and_buffers_on_each_replicas_device(lists):
    got = run("ex03", _replicate_places, lists)
    buffers = [q for q, _, _ in _tensors_by_name(_Buffers(), "_buffers")]
    for devices, result in zip(lists, got):
        where = f"replicate(model, {devices})"
        assert result["error"] is None, f"{where}: raised {result['error']}"
        assert result["type"] == "list", f"{where}: return a list, got {result['type']}"
        assert len(result["replicas"]) == len(devices), f"{where}: one replica per device, got {len(result['replicas'])}"
        assert result["unchanged"], f"{where}: the module must be left as it was (Parameters, buffers and values)"
        for i, (device, places) in enumerate(zip(devices, result["replicas"])):
            for name, place in places.items():
                assert place["device"] == device, (
                    f"{where}: replica {i}'s {name} must be on devices[{i}] = {device!r}, found {place['device']!r}"
                    + (" (every replica's buffers move too, not only its parameters)" if name in buffers else ""))
            for name in buffers:
                if i == 0:
                    assert places[name]["original"], (
                        f"{where}: replica 0's {name} must be the module's very own buffer (in-place updates reach it)")
                else:
                    assert not places[name]["original"] and not places[name]["shares"], (
                        f"{where}: replica {i}'s {name} must be a copy of its own, not the module's buffer")


STEP_LOSS_CASES = [(10, 4), (5, 4), (7, 3), (1, 2), (6, 1)]


def _counted_loss_steps(module, cases):
    results = []
    for batch, n in cases:
        model = _StepNet()
        optimizer = _SGD(model.parameters(), lr=0.1)
        x, extra, y = _step_data(batch)
        before = copy.deepcopy((x, extra, y))
        calls = []

        def loss_fn(output, targets):
            calls.append({"rows": int(output.shape[0]), "targets": int(targets.shape[0]),
                          "device": output.device.type, "graph": output.grad_fn is not None})
            return F.cross_entropy(output, targets)

        _StepNet.calls = []
        error, loss = _raised(module.data_parallel_step, model, optimizer, (x, extra), y, loss_fn, ["cpu"] * n)
        results.append({"error": error, "calls": calls, "type": type(loss).__name__,
                        "loss": loss if isinstance(loss, float) else None,
                        "unchanged": _same(before, (x, extra, y))})
    return results


@pytest.mark.points(2)
def test_data_parallel_step_computes_the_loss_once_on_the_gathered_output():
    got = run("ex03", _counted_loss_steps, STEP_LOSS_CASES)
    for (batch, n), result in zip(STEP_LOSS_CASES, got):
        where = f"a batch of {batch} over {n} devices"
        assert result["error"] is None, f"{where}: raised {result['error']}"
        seen = [(c["rows"], c["targets"]) for c in result["calls"]]
        assert seen == [(batch, batch)], (
            f"{where}: loss_fn must be called once, on the gathered output of all {batch} rows and all the targets "
            f"(not once per replica, then combined); it was called on (output rows, targets) = {seen}")
        assert result["calls"][0]["graph"], f"{where}: the gathered output given to loss_fn must carry autograd history"
        assert result["type"] == "float", f"{where}: return the loss as a Python float, got {result['type']}"
        model = _StepNet()
        x, extra, y = _step_data(batch)
        expected = F.cross_entropy(model(x, extra), y).item()
        assert result["loss"] == pytest.approx(expected, rel=1e-5), f"{where}: expected loss {expected}"
        assert result["unchanged"], f"{where}: the step must leave its inputs and targets unchanged"


_MODULE_NAMES = ["module", "submodule", "head", "0", "encoder"]  # "module" and "submodule": not the wrapper's prefix
_KEYS = st.tuples(st.lists(st.sampled_from(_MODULE_NAMES), max_size=2),
                  st.sampled_from(["weight", "bias", "running_mean"])).map(lambda t: ".".join(t[0] + [t[1]]))


@st.composite
def _adapt_cases(draw):
    keys = draw(st.lists(_KEYS, min_size=1, max_size=6, unique=True))
    return (keys, draw(st.booleans()), draw(st.booleans()), draw(st.sampled_from(["dict", "OrderedDict"])),
            draw(st.sampled_from(["none", "none", "drop", "extra"])))


def _keyed_module(keys):
    """A module whose state_dict has exactly `keys` (buffers in nested plain modules)."""
    root = nn.Module()
    for key in keys:
        *path, leaf = key.split(".")
        sub = root
        for name in path:
            if name not in sub._modules:
                sub.add_module(name, nn.Module())
            sub = sub._modules[name]
        sub.register_buffer(leaf, torch.zeros(1))
    return root


def _checkpoint_keys(keys, wrapped, change):
    keys = list(keys) if change != "drop" else list(keys)[:-1]
    keys = keys + ["encoder.foreign"] if change == "extra" else keys  # "foreign" is never a key of the model
    return ["module." + k for k in keys] if wrapped else keys


def _adapt_generated(module, cases):
    results = []
    for keys, checkpoint_wrapped, model_wrapped, kind, change in cases:
        model = _keyed_module(keys)
        if model_wrapped:
            wrapper = nn.Module()
            wrapper.add_module("module", model)  # what DataParallel and DDP do
            model = wrapper
        entries = [(k, torch.full((1,), float(j))) for j, k in enumerate(_checkpoint_keys(keys, checkpoint_wrapped, change))]
        checkpoint = OrderedDict(entries) if kind == "OrderedDict" else dict(entries)
        before = list(checkpoint.items())
        error, adapted = _raised(module.adapt_state_dict, checkpoint, model)
        result = {"error": error, "type": type(adapted).__name__,
                  "unchanged": type(checkpoint).__name__ == kind and len(checkpoint) == len(before)
                  and all(k == k0 and v is v0 for (k, v), (k0, v0) in zip(checkpoint.items(), before)),
                  "model_keys": list(model.state_dict())}
        if error is None and hasattr(adapted, "items"):
            result.update(keys=list(adapted.keys()), fresh=adapted is not checkpoint,
                          same_values=len(adapted) == len(before)
                          and all(v is v0 for v, (_, v0) in zip(adapted.values(), before)))
        results.append(result)
    return results


def _adapted_keys(checkpoint, wanted):
    """The reference: the checkpoint's keys as they are, without torch's stripped prefix, or with it added; None if none fits."""
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    wanted = set(wanted)
    if set(checkpoint) == wanted:
        return list(checkpoint)
    stripped = OrderedDict.fromkeys(checkpoint)
    consume_prefix_in_state_dict_if_present(stripped, "module.")
    if all(k.startswith("module.") for k in checkpoint) and set(stripped) == wanted:
        return list(stripped)
    if {"module." + k for k in checkpoint} == wanted:
        return ["module." + k for k in checkpoint]
    return None


@pytest.mark.points(2)
@settings(max_examples=6)
@given(cases=st.lists(_adapt_cases(), min_size=1, max_size=5))
@example(cases=[(["fc.weight", "module.bias", "head.module.weight"], True, False, "dict", "none"),
                (["fc.weight", "fc.bias"], False, False, "dict", "none"),
                (["module.weight", "submodule.bias"], False, True, "OrderedDict", "none")])
def test_adapt_state_dict_on_generated_checkpoints_returns_a_new_ordered_dict(cases):
    got = run("ex03", _adapt_generated, cases)
    for (keys, checkpoint_wrapped, model_wrapped, kind, change), result in zip(cases, got):
        checkpoint = _checkpoint_keys(keys, checkpoint_wrapped, change)
        where = f"adapt_state_dict(a {kind} with keys {checkpoint}, a model with keys {result['model_keys']})"
        assert result["unchanged"], (f"{where}: the caller's checkpoint must be left as it was (same type, keys, "
                                     "order and values): build a new OrderedDict, never rename keys in place")
        expected = _adapted_keys(checkpoint, result["model_keys"])
        if expected is None:
            assert result["error"] and result["error"].startswith("KeyError"), (
                f"{where}: no way to make the keys fit: expected KeyError, got {result['error'] or 'a result'}")
            continue
        assert result["error"] is None, f"{where}: raised {result['error']}"
        assert result["type"] == "OrderedDict", f"{where}: return an OrderedDict, got {result['type']}"
        assert result["fresh"], f"{where}: return a new OrderedDict, not the checkpoint itself"
        assert result["keys"] == expected, f"{where}: expected keys {expected}, got {result['keys']}"
        assert result["same_values"], f"{where}: keep the very same value objects (no copies), in the same order"
