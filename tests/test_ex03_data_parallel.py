"""Graded tests for exercise 03 (notebooks/03_data_parallel.ipynb).

References are computed here, in the test process: torch.chunk / torch.cat, a single-device training step on
the whole batch, a fresh model run on one chunk, torch's consume_prefix_in_state_dict_if_present, and, where
there are two GPUs, torch.nn.parallel's own scatter, gather and replicate.

Besides the results, the tests check the algorithm: devices lists such as ["cpu", "meta", "cpu"] show where each
piece lands (the meta device has shapes and no data), the step's model records every forward call (which object
ran, on how many rows), and a model that sleeps shows whether the replicas ran at the same time.
"""

from __future__ import annotations

import time
from collections import OrderedDict, namedtuple
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading import exception_raised_by, run

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
        results.append({"out": out.detach().clone(), "grads": [p.grad for p in parts]})
    meta = module.gather([torch.ones(2, 2), torch.ones(1, 2)], "meta")
    results.append(meta.device.type)
    return results


@pytest.mark.points(2)
def test_gather_concatenates_in_order_and_keeps_gradients():
    got = run("ex03", _gather_flat)
    for (dim, shapes), result in zip(GATHER_CASES, got[:3]):
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
    assert got[3] == "meta", "the result must be on the device asked for"


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
    on_meta = module.replicate(_mlp(), ["cpu", "meta"])[1]
    weight = on_meta[0].weight
    placed = [weight.device.type, bool(weight.requires_grad and weight.grad_fn is not None),
              on_meta(x.to("meta")).device.type if weight.device.type == "meta" else "not run"]
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
    device, linked, output = got["placed"]
    assert device == "meta" and output == "meta", (
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


STEP_CASES = [(10, 4), (5, 4), (8, 2)]  # chunks 3,3,3,1 · 2,2,1 (3 of 4 devices used) · 4,4


def _steps(module, cases):
    results = []
    for batch, n in cases:
        model = _StepNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
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
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
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
