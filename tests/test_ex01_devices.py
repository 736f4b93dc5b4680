"""Graded tests for exercise 01 (notebooks/01_devices_and_memory.ipynb).

Each test runs fixed examples first (an untouched stub fails there at once), then cases Hypothesis draws.
"""

from collections import OrderedDict, UserDict, defaultdict
from types import SimpleNamespace

import pytest
import torch
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.data import small_mlp
from course_lib.grading import exception_raised_by, run
from course_lib.grading.nesting import Pair, Triple  # the child unpickles them from here, without Hypothesis
from course_lib.grading.properties import batch_tensors, nested, plain_values
from course_lib.memory import saved_activation_bytes

# ---------------------------------------------------------------- to_device

_MISSING = "<missing>"


def _children(value):
    """(key, child) pairs of a container, or None for a tensor or any other value (a string is a value)."""
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, (dict, UserDict)):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    return None


def _child(container, key):
    """container[key] if it is there (read without side effects: a defaultdict must not grow), else _MISSING."""
    try:
        if isinstance(container, (dict, UserDict)):
            return container[key] if key in container.keys() else _MISSING
        if isinstance(container, (list, tuple)) and isinstance(key, int) and key < len(container):
            return container[key]
    except Exception:  # noqa: BLE001 - whatever the learner returned, describe it as missing
        pass
    return _MISSING


def _picture(value, device=None, grad=False):
    """Plain-data picture of a nested batch: container types (a defaultdict's factory too), tensors' device, dtype
    and shape (and requires_grad if `grad`), other values' type and repr. `device` replaces every tensor's device."""
    if isinstance(value, torch.Tensor):
        info = [device or value.device.type, str(value.dtype), list(value.shape)]
        return {"tensor": info + [value.requires_grad] if grad else info}
    kind = type(value).__name__
    if isinstance(value, (dict, UserDict)):
        factory = getattr(value.default_factory, "__name__", repr(value.default_factory)) \
            if isinstance(value, defaultdict) else None
        return {"mapping": kind, "factory": factory, "items": [[k, _picture(v, device, grad)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"sequence": kind, "items": [_picture(v, device, grad) for v in value]}
    return {"value": [kind, repr(value)[:200]]}


def _shown(picture):
    """A picture in a few words, for a message."""
    if not isinstance(picture, dict):
        return repr(picture)
    if "tensor" in picture:
        device, dtype, shape = picture["tensor"][:3]
        return f"a {dtype.removeprefix('torch.')} tensor of shape {shape} on {device}"
    if "value" in picture:
        return f"{picture['value'][1]} (a {picture['value'][0]})"
    kind = picture.get("mapping") or picture.get("sequence")
    factory = f" with default_factory {picture['factory']}" if picture.get("factory") else ""
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return f"{article} {kind}{factory} of {len(picture['items'])} item(s)"


def _difference(want, got, path="batch"):
    """Where the picture `got` first differs from `want`, in words (None when they are equal)."""
    if want == got:
        return None
    if not isinstance(got, dict) or set(want) != set(got) or want.get("mapping") != got.get("mapping") \
            or want.get("sequence") != got.get("sequence") or want.get("factory") != got.get("factory"):
        return f"{path} should be {_shown(want)}, got {_shown(got)}"
    if "mapping" in want:
        keys, got_keys = [k for k, _ in want["items"]], [k for k, _ in got["items"]]
        if keys != got_keys:
            return f"{path} should have the keys {keys} in this order, got {got_keys}"
        for (key, w), (_, g) in zip(want["items"], got["items"]):
            if w != g:
                return _difference(w, g, f"{path}[{key!r}]")
    if "sequence" in want:
        if len(want["items"]) != len(got["items"]):
            return f"{path} should hold {len(want['items'])} item(s), got {len(got['items'])}"
        for index, (w, g) in enumerate(zip(want["items"], got["items"])):
            if w != g:
                return _difference(w, g, f"{path}[{index}]")
    return f"{path} should be {_shown(want)}, got {_shown(got)}"


def _short(value, limit=300):
    """A batch in one line: tensors by shape, dtype and device, not by their values."""
    def text(v):
        if isinstance(v, torch.Tensor):
            grad = ", requires_grad" if v.requires_grad else ""
            return f"tensor({list(v.shape)}, {str(v.dtype).removeprefix('torch.')}, {v.device.type}{grad})"
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return f"{type(v).__name__}({', '.join(f'{f}={text(x)}' for f, x in zip(v._fields, v))})"
        if isinstance(v, (dict, UserDict)):
            inside = "{" + ", ".join(f"{k!r}: {text(x)}" for k, x in v.items()) + "}"
            if isinstance(v, defaultdict):
                return f"defaultdict({getattr(v.default_factory, '__name__', v.default_factory)}, {inside})"
            return inside if type(v) is dict else f"{type(v).__name__}({inside})"
        if isinstance(v, list):
            return "[" + ", ".join(text(x) for x in v) + "]"
        if isinstance(v, tuple):
            return "(" + ", ".join(text(x) for x in v) + (",)" if len(v) == 1 else ")")
        return repr(v)

    shown = text(value)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def _nodes(value, path="batch"):
    """Every (path, node) of a nested batch, containers before their children, in a fixed order."""
    found = [(path, value)]
    for key, child in _children(value) or []:
        found += _nodes(child, f"{path}[{key!r}]")
    return found


def _connected(moved, original):
    """Whether gradients through `moved` reach the leaf `original` (its AccumulateGrad node), without running backward."""
    if moved is original:
        return True
    seen, stack = set(), [moved.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if getattr(node, "variable", None) is original:
            return True
        stack.extend(fn for fn, _ in node.next_functions)
    return False


def _compare(original, moved, path, out):
    """One entry per node of the input, with what the output holds at the same place."""
    if isinstance(original, torch.Tensor):
        ok = isinstance(moved, torch.Tensor)
        out.append({"path": path, "kind": "tensor", "is_tensor": ok,
                    "values": moved.detach().clone() if ok and moved.device.type == "cpu" else None,
                    "requires_grad": bool(ok and moved.requires_grad),
                    "connected": bool(ok and original.requires_grad and _connected(moved, original))})
        return
    children = _children(original)
    if children is None:
        out.append({"path": path, "kind": "value", "same": moved is original})
        return
    out.append({"path": path, "kind": "container", "new": moved is not original,
                "mutable": not isinstance(original, tuple)})
    for key, child in children:
        _compare(child, _child(moved, key), f"{path}[{key!r}]", out)


def _same_tensor(expected, value):
    """Whether `value` is a CPU tensor equal to `expected` (torch.equal raises NotImplementedError on meta tensors)."""
    return (isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype == expected.dtype
            and value.shape == expected.shape and torch.equal(value, expected))


def _move(module, cases):
    """Move each (batch, device) case; report the result, the input after the call, and node-by-node facts."""
    results = []
    for batch, device in cases:
        before = _nodes(batch)
        values = [node.clone() if isinstance(node, torch.Tensor) and node.device.type != "meta" else None
                  for _, node in before]
        picture = _picture(batch, grad=True)
        moved = module.to_device(batch, device)
        after = _nodes(batch)
        same_nodes = len(before) == len(after) and all(a[1] is b[1] for a, b in zip(before, after))
        same_values = all(v is None or _same_tensor(v, node) for v, (_, node) in zip(values, after))
        pairs = []
        _compare(batch, moved, "batch", pairs)
        results.append({"input_before": picture, "input_after": _picture(batch, grad=True),
                        "input_kept": bool(same_nodes and same_values), "moved": _picture(moved),
                        "moved_with_grad": _picture(moved, grad=True), "pairs": pairs})
    return results


def _check_moves(cases, results):
    for (batch, device), got in zip(cases, results):
        where = f"to_device(batch, {device!r}) with batch = {_short(batch)}\n"
        assert got["input_before"] == _picture(batch, grad=True), "the batch did not reach the child intact (test bug)"
        assert got["input_after"] == got["input_before"] and got["input_kept"], (
            f"{where}the input batch must be left unchanged (build new containers, do not assign into the input's)")
        want = _picture(batch, device=torch.device(device).type)
        assert got["moved"] == want, (f"{where}{_difference(want, got['moved'])} (every tensor must move, every "
                                      "container keep its type, keys and order, other values stay as they are)")
        tensors = [node for _, node in _nodes(batch) if isinstance(node, torch.Tensor)]
        facts = [fact for fact in got["pairs"] if fact["kind"] == "tensor"]
        for tensor, fact in zip(tensors, facts):
            if fact["values"] is not None and tensor.device.type != "meta":
                assert torch.equal(fact["values"], tensor), f"{where}{fact['path']} has other values after the move"
        for fact in got["pairs"]:
            if fact["kind"] == "value":
                assert fact["same"], (f"{where}{fact['path']} is not a tensor or a container, so it must come back "
                                      "as the very same object, not a copy")
            if fact["kind"] == "container" and fact["mutable"]:
                assert fact["new"], (f"{where}{fact['path']} came back as the input's own container; return a new "
                                     "one (a caller that changes the result would change the input)")


def _fixed_batch():
    """Every kind of container and leaf once, with keys in a non-sorted order."""
    return {
        "pixels": torch.ones(2, 3),
        "ordered": OrderedDict([("z", torch.ones(1)), ("a", 3)]),  # stays an OrderedDict, keys in this order
        "meta": {"ids": [7, "a", None], "mask": torch.zeros(4, dtype=torch.bool)},
        "pairs": [Pair(torch.arange(3), 1), Pair(torch.arange(2.0), "x")],
        "shape": (torch.tensor(5), 2.5),
        "name": "batch-0",  # a string is a value, not a sequence
        "lookup": defaultdict(list, {"b": torch.full((2,), 2.0), "a": []}),  # keeps its default_factory
        "user": UserDict({"w": torch.ones(2, 2, dtype=torch.float64), "note": SimpleNamespace(scale=0.5)}),
        "empty": [[], (), {}],
        "triple": Triple(torch.empty(0, 3), torch.ones(1, dtype=torch.bfloat16), SimpleNamespace(tag="t")),
    }


DEVICES = ["meta", torch.device("meta"), "cpu", torch.device("cpu")]  # meta: shapes, no data; runs on any machine


@st.composite
def _leaf_tensor(draw, meta):
    tensor = draw(batch_tensors())
    if tensor.is_floating_point() and draw(st.booleans()):
        tensor.requires_grad_(True)
    if meta and draw(st.booleans()):  # a tensor already on the target device
        tensor = tensor.detach().to("meta").requires_grad_(tensor.requires_grad)
    return tensor


@st.composite
def _move_case(draw, leaf_values=plain_values()):
    device = draw(st.sampled_from(DEVICES))
    on_meta = torch.device(device).type == "meta"
    batch = draw(nested(st.one_of(_leaf_tensor(on_meta), leaf_values)))
    return batch, device


@pytest.mark.points(2)
@settings(max_examples=10)
@given(cases=st.lists(_move_case(), min_size=1, max_size=4))
@example(cases=[(_fixed_batch(), device) for device in DEVICES])
def test_to_device_moves_every_tensor_and_keeps_the_structure(cases):
    _check_moves(cases, run("ex01", _move, cases))


def _grad_tensor(dtype):
    return st.builds(lambda shape, seed: torch.randn(shape, generator=torch.Generator().manual_seed(seed),
                                                     dtype=dtype).requires_grad_(True),
                     st.lists(st.integers(0, 3), max_size=2), st.integers(0, 2**16))


GRAD_LEAVES = st.one_of(*[_grad_tensor(dtype) for dtype in (torch.float32, torch.float64, torch.bfloat16)])


def _grad_batch():
    weight = torch.randn(3, 2, requires_grad=True)
    return {"w": weight, "rest": [torch.ones(2, requires_grad=True), torch.zeros(2), "id-7"],
            "pair": Pair(torch.ones((), dtype=torch.float64, requires_grad=True), 1)}


@pytest.mark.points(1)
@settings(max_examples=6)
@given(cases=st.lists(st.tuples(nested(st.one_of(GRAD_LEAVES, plain_values())), st.sampled_from(DEVICES)),
                      min_size=1, max_size=4))
@example(cases=[(_grad_batch(), "meta"), (_grad_batch(), "cpu")])
def test_to_device_keeps_requires_grad_and_the_graph(cases):
    for (batch, device), got in zip(cases, run("ex01", _move, cases)):
        where = f"to_device(batch, {device!r}) with batch = {_short(batch)}\n"
        tensors = [(path, node) for path, node in _nodes(batch) if isinstance(node, torch.Tensor)]
        facts = [fact for fact in got["pairs"] if fact["kind"] == "tensor"]
        assert len(facts) == len(tensors)
        for (path, tensor), fact in zip(tensors, facts):
            assert fact["is_tensor"], f"{where}{path} should be a tensor after the move"
            assert fact["requires_grad"] == tensor.requires_grad, (
                f"{where}{path} had requires_grad={tensor.requires_grad}; the moved tensor must keep it "
                "(t.to(device) does; detach() or torch.no_grad() lose it)")
            if tensor.requires_grad:
                assert fact["connected"], (f"{where}{path} is cut off from the autograd graph: gradients through "
                                           "the moved tensor must flow back to the original (t.to(device) keeps "
                                           "the link; detach() followed by requires_grad_() makes a new leaf)")


BAD_DEVICES = [3.5, None, 0, ["cpu"], b"cpu"]


def _bad_device(module, cases):
    results = []
    for batch, device in cases:
        kind, message = exception_raised_by(module.to_device, batch, device)
        results.append([kind, message])
    return results


@pytest.mark.points(1)
@settings(max_examples=5)
@given(cases=st.lists(st.tuples(nested(st.one_of(batch_tensors(), plain_values())), st.sampled_from(BAD_DEVICES)),
                      min_size=1, max_size=4))
@example(cases=[({"x": torch.ones(1)}, device) for device in BAD_DEVICES] + [({"ids": [1, 2]}, 3.5), ([], 0)])
def test_to_device_rejects_a_device_that_is_not_a_device(cases):
    for (batch, device), (kind, message) in zip(cases, run("ex01", _bad_device, cases)):
        where = f"to_device({_short(batch)}, {device!r})"
        assert kind == "TypeError", (f"{where}: expected TypeError (a device is a str or a torch.device), got {kind}; "
                                     "check the device first, not only when a tensor is found")
        assert "device" in message.lower(), f"{where}: the message should say what a device must be: {message!r}"


# ---------------------------------------------------------------- training_state_bytes


class _WithBuffers(nn.Module):
    """BatchNorm keeps running statistics in buffers: they are in state_dict() but are not parameters."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.layer(x))))


class _Tied(nn.Module):
    """Embedding and output layer share one weight: it must count once."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.mid = nn.Linear(6, 6)
        self.out = nn.Linear(6, 11, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x):
        return self.out(torch.relu(self.mid(self.embed(x))))


OPTIMIZERS = {
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "rmsprop": lambda params: torch.optim.RMSprop(params, lr=1e-3, momentum=0.5),
    "adagrad": lambda params: torch.optim.Adagrad(params, lr=0.1),  # makes its states when built
}


def _setup(case, measure=None):
    """A model and optimizer after some training, as `case` (a dict of plain values) says. `measure`, if given, is
    entered around everything the measured optimizer allocates (its construction and its steps).

    case: model ("mlp", "tied", "batchnorm"), dtype, optimizer (a key of OPTIMIZERS), steps (0, 1 or 2),
    frozen_before (freeze the first layer before training), second_optimizer (another optimizer holds the last layer),
    outside (the optimizer also holds a parameter that is not in the model), frozen_after (freeze the first layer
    after the last backward: its .grad stays), zero_grad (None, "none" or "zeros", after training).
    """
    from contextlib import nullcontext

    measure = measure or nullcontext()
    torch.manual_seed(0)
    classes = {"mlp": 4, "tied": 11, "batchnorm": 4}[case["model"]]
    model = {"mlp": lambda: small_mlp(8, 16, 4, 2), "tied": _Tied, "batchnorm": _WithBuffers}[case["model"]]()
    model = model.to(case["dtype"])
    if case["model"] == "tied":
        x = torch.randint(0, 11, (5,))
    else:
        x = torch.randn(5, 8, dtype=case["dtype"])
    y = torch.randint(0, classes, (5,))
    layers = [m for m in model.modules() if list(m.parameters(recurse=False))]
    if case.get("frozen_before"):
        for p in layers[0].parameters():
            p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    others = []
    if case.get("second_optimizer"):
        held = {id(p) for p in layers[-1].parameters()}
        others = [p for p in trainable if id(p) in held]
        trainable = [p for p in trainable if id(p) not in held]
    scale = nn.Parameter(torch.ones(classes, dtype=case["dtype"])) if case.get("outside") else None
    with measure:
        optimizer = OPTIMIZERS[case["optimizer"]](trainable + ([scale] if scale is not None else []))
    second = torch.optim.SGD(others, lr=0.1, momentum=0.9) if others else None
    for step in range(max(1, case["steps"])):
        logits = model(x).float()
        if scale is not None:
            logits = logits * scale.float()
        nn.functional.cross_entropy(logits, y).backward()
        if case["steps"] > step:
            with measure:
                optimizer.step()
            if second is not None:
                second.step()
    if case.get("frozen_after"):
        for p in layers[0].parameters():
            p.requires_grad_(False)
    if case.get("zero_grad"):
        optimizer.zero_grad(set_to_none=case["zero_grad"] == "none")
    return model, optimizer


def _snapshot(model, optimizer):
    """What the call must not change: the parameters, their gradients, and optimizer.state (keys and tensors)."""
    params = [(p, p.detach().clone(), p.requires_grad, p.grad, None if p.grad is None else p.grad.clone())
              for p in model.parameters()]
    state = [(p, {k: (v, v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()})
             for p, s in optimizer.state.items()]
    return params, state


def _unchanged(model, optimizer, snapshot):
    params, state = snapshot
    now = list(model.parameters())
    if len(now) != len(params) or len(optimizer.state) != len(state):
        return False
    for p, (q, value, requires_grad, grad, grad_value) in zip(now, params):
        if p is not q or p.requires_grad != requires_grad or p.grad is not grad or not torch.equal(p.detach(), value):
            return False
        if grad is not None and not torch.equal(grad, grad_value):
            return False
    for (p, entries) in state:
        if p not in optimizer.state or set(optimizer.state[p]) != set(entries):
            return False
        for k, (v, v_value) in entries.items():
            if optimizer.state[p][k] is not v or (isinstance(v, torch.Tensor) and not torch.equal(v, v_value)):
                return False
    return True


def _state_bytes(module, trainings):
    """Each training is (model, optimizer, [(parameter, grad)]): built and measured in the test process, sent here
    whole (pickling keeps the optimizer's parameters the model's own, but drops .grad, so the grads come apart)."""
    results = []
    for model, optimizer, grads in trainings:
        for parameter, grad in grads:
            parameter.grad = grad
        snapshot = _snapshot(model, optimizer)
        got = module.training_state_bytes(model, optimizer)
        entries = {}
        if isinstance(got, dict):
            for key, value in got.items():
                try:
                    number = int(value)
                except (TypeError, ValueError, RuntimeError):
                    number = None
                entries[str(key)] = [type(value).__name__, number]
        results.append({"type": type(got).__name__, "entries": entries,
                        "unchanged": _unchanged(model, optimizer, snapshot)})
    return results


def _new_memory_kept():
    """A TorchDispatchMode that notes every tensor made while it is active; kept_bytes() measures what survives.

    Around the optimizer's construction and steps, what survives is what the optimizer allocated and keeps: its
    states. Measured from the allocations themselves, so the reference does not depend on how optimizer.state is
    laid out.
    """
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    class MemoryKept(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False  # the default wraps __torch_dispatch__ with torch._dynamo, whose import takes seconds

        def __init__(self):
            super().__init__()
            self.made = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for value in (out if isinstance(out, (list, tuple)) else [out]):
                if isinstance(value, torch.Tensor):
                    self.made.append(weakref.ref(value))
            return out

        def kept_bytes(self, existing):
            """Bytes of the distinct storages made while active, still alive, and not among `existing` tensors."""
            old = {t.untyped_storage().data_ptr() for t in existing}
            kept = {}
            for ref in self.made:
                t = ref()
                if t is not None and t.untyped_storage().data_ptr() not in old:
                    kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return sum(kept.values())

    return MemoryKept()


def _training(case):
    """(model, optimizer, grads) after the training `case` describes, and the bytes measured from memory: distinct
    storages of the parameters and gradients, and what the optimizer allocated and kept."""
    measure = _new_memory_kept()
    model, optimizer = _setup(case, measure=measure)
    params = [p for m in model.modules() for p in m._parameters.values() if p is not None]
    grads = [p.grad for p in params if p.grad is not None]
    held = [p for group in optimizer.param_groups for p in group["params"]]
    held_grads = [p.grad for p in held if p.grad is not None]

    def storage_bytes(tensors):
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())

    expected = {"parameters": storage_bytes(params), "gradients": storage_bytes(grads),
                "optimizer_states": measure.kept_bytes(params + grads + held + held_grads)}
    every = list({id(p): p for p in params + held}.values())
    return (model, optimizer, [(p, p.grad) for p in every if p.grad is not None]), expected


def _case(name, **changes):
    case = {"name": name, "model": "mlp", "dtype": torch.float32, "optimizer": "adam", "steps": 1}
    case.update(changes)
    return case


CASES = [
    _case("adam"),
    _case("sgd_momentum", optimizer="sgd_momentum"),
    _case("sgd_plain", optimizer="sgd"),
    _case("bf16_adamw", dtype=torch.bfloat16, optimizer="adamw"),
    _case("frozen_first_layer_sgd", optimizer="sgd_momentum", frozen_before=True),
    _case("tied", model="tied"),
    _case("adam_after_zero_grad", zero_grad="none"),
    _case("batchnorm", model="batchnorm"),
    _case("second_optimizer_holds_the_last_layer", second_optimizer=True),
    _case("layer_frozen_after_backward", frozen_after=True),
    _case("parameter_outside_the_model", outside=True, optimizer="sgd_momentum"),
    _case("adagrad_before_any_step", optimizer="adagrad", steps=0),
    _case("float64_rmsprop_two_steps_zero_grad_to_zeros", dtype=torch.float64, optimizer="rmsprop", steps=2,
          zero_grad="zeros"),
]

GENERATED_CASE = st.fixed_dictionaries({
    "name": st.just("generated"),
    "model": st.sampled_from(["mlp", "tied", "batchnorm"]),
    "dtype": st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    "optimizer": st.sampled_from(sorted(OPTIMIZERS)),
    "steps": st.integers(0, 2),
    "frozen_before": st.booleans(),
    "second_optimizer": st.booleans(),
    "outside": st.booleans(),
    "frozen_after": st.booleans(),
    "zero_grad": st.sampled_from([None, "none", "zeros"]),
})


def _describe_case(case):
    shown = {k: v for k, v in case.items() if k != "name" and v}
    return f"{case['name']} ({', '.join(f'{k}={v}' for k, v in shown.items())})"


def _check_state_bytes(cases):
    """Train each case here, measure it, and compare with what training_state_bytes says in the child."""
    trainings, expected = zip(*(_training(case) for case in cases))
    for case, want, got in zip(cases, expected, run("ex01", _state_bytes, list(trainings))):
        where = _describe_case(case)
        assert got["type"] == "dict", f"{where}: return a dict, not a {got['type']}"
        assert set(got["entries"]) == set(want), f"{where}: return exactly the keys {sorted(want)}"
        for key in want:
            kind, number = got["entries"][key]
            assert number == want[key], f"{where}: {key} should be {want[key]} bytes, got {number}"
            assert kind == "int", f"{where}: {key} should be a Python int, got a {kind}"
        assert got["unchanged"], (f"{where}: the model or the optimizer changed; only read them (optimizer.state is "
                                  "a defaultdict: optimizer.state[p] adds an entry for a parameter it does not hold)")


@pytest.mark.points(2)
def test_training_state_bytes_matches_the_tensors():
    _check_state_bytes(CASES)


@pytest.mark.points(2)
@settings(max_examples=8, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: each step trains
@given(cases=st.lists(GENERATED_CASE, min_size=1, max_size=4))
@example(cases=[_case("everything_at_once", model="tied", dtype=torch.bfloat16, optimizer="rmsprop", steps=2,
                      frozen_before=True, second_optimizer=True, outside=True, frozen_after=True, zero_grad="zeros")])
def test_training_state_bytes_over_generated_trainings(cases):
    """The failing case is named in the message; the list is not shrunk (each try trains and measures a model)."""
    _check_state_bytes(cases)


def _bad_state_args(module, cases):
    return [exception_raised_by(module.training_state_bytes, *args)[0] for args in cases]


@pytest.mark.points(1)
def test_training_state_bytes_rejects_wrong_types():
    model = small_mlp(4, 4, 2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # built here: building one in the child imports dynamo
    cases = [(model, "adam"), ("model", optimizer), (model, None), (list(model.parameters()), optimizer)]
    got = run("ex01", _bad_state_args, cases)
    for (model_arg, optimizer_arg), kind in zip(cases, got):
        assert kind == "TypeError", (f"training_state_bytes(a {type(model_arg).__name__}, a "
                                     f"{type(optimizer_arg).__name__}): expected TypeError (the model must be an "
                                     f"nn.Module, the optimizer a torch.optim.Optimizer), got {kind}")


# ---------------------------------------------------------------- mlp_activation_bytes


def _measured_activation_bytes(batch_size, features, hidden, classes, depth, dtype):
    """What autograd really saves: every saved tensor's storage once, parameters left out."""
    torch.manual_seed(0)
    model = small_mlp(features, hidden, classes, depth).to(dtype)
    return saved_activation_bytes(model, torch.randn(batch_size, features, dtype=dtype))


SIZES = [(8, 32, 64, 10, 2, torch.float32), (16, 5, 7, 3, 1, torch.float32), (4, 32, 64, 10, 3, torch.bfloat16),
         (1, 3, 300, 1000, 4, torch.float64), (64, 20, 20, 2, 1, torch.float16), (1, 1, 1, 1, 1, torch.float32)]

GENERATED_SIZES = st.tuples(st.integers(1, 16), st.integers(1, 24), st.integers(1, 24), st.integers(1, 12),
                            st.integers(1, 4), st.sampled_from([torch.float32, torch.float64, torch.bfloat16,
                                                                torch.float16]))


def _estimates(module, sizes):
    results = []
    for args in sizes:
        got = module.mlp_activation_bytes(*args)
        try:
            number = int(got)
        except (TypeError, ValueError, RuntimeError):
            number = None
        results.append([type(got).__name__, number, repr(got)[:80]])
    return results


@pytest.mark.points(3)
@settings(max_examples=8)
@given(sizes=st.lists(GENERATED_SIZES, min_size=1, max_size=5))
@example(sizes=SIZES)
def test_mlp_activation_bytes_matches_what_autograd_saves(sizes):
    got = run("ex01", _estimates, sizes)
    for args, (kind, number, text) in zip(sizes, got):
        measured = _measured_activation_bytes(*args)
        assert number == measured, (f"batch, features, hidden, classes, depth, dtype = {args}: autograd saved "
                                    f"{measured} bytes, the estimate was {text}")
        assert kind == "int", f"{args}: return a Python int, got {text} (a {kind})"


BAD_SIZES = [(0, 4, 4, 2, 1), (4, 4, 4, 2, 0), (4, -1, 4, 2, 1),
             (4, 4, 4, 0, 1), (4, 4, 0, 2, 1), (4, 4, 4, -3, 2)]  # classes and hidden are sizes too


@st.composite
def _bad_sizes_case(draw):
    sizes = list(draw(st.tuples(*[st.integers(1, 9)] * 5)))
    sizes[draw(st.integers(0, 4))] = draw(st.integers(-3, 0))
    return tuple(sizes)


def _bad_sizes(module, cases):
    return [exception_raised_by(module.mlp_activation_bytes, *args)[0] for args in cases]


@pytest.mark.points(1)
@settings(max_examples=5)
@given(cases=st.lists(_bad_sizes_case(), min_size=1, max_size=6))
@example(cases=BAD_SIZES)
def test_mlp_activation_bytes_rejects_bad_sizes(cases):
    for args, kind in zip(cases, run("ex01", _bad_sizes, cases)):
        assert kind == "ValueError", (f"batch, features, hidden, classes, depth = {args}: expected ValueError "
                                      f"(every size must be 1 or more), got {kind}")


# ---------------------------------------------------------------- device_for_rank

PLACEMENTS = [
    # (env, gpus on this machine) -> expected device
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "RANK": "0"}, 2, "cuda:0"),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "RANK": "1"}, 8, "cuda:1"),
    ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "RANK": "7"}, 4, "cuda:3"),  # 2nd node: global rank 7
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "RANK": "2"}, 2, "cpu"),     # fewer GPUs than ranks
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "RANK": "0"}, 0, "cpu"),     # a laptop
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, 1, "cuda:0"),
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "RANK": "4"}, 2, "cpu"),     # 2 GPUs for 4 ranks: none get one
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8", "RANK": "9"}, 4, "cpu"),
    # the second of two machines: WORLD_SIZE (8) exceeds this machine's 4 GPUs, but each local rank has one
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "RANK": "5", "WORLD_SIZE": "8", "GROUP_RANK": "1"}, 4, "cuda:1"),
]


@st.composite
def _placement(draw):
    """A rank of a job on `machines` machines, with some of the other variables torchrun sets."""
    local_world_size = draw(st.integers(1, 8))
    local_rank = draw(st.integers(0, local_world_size - 1))
    machines = draw(st.integers(1, 3))
    machine = draw(st.integers(0, machines - 1))
    gpus = draw(st.integers(0, 9))
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_world_size)}
    others = {"RANK": str(machine * local_world_size + local_rank), "WORLD_SIZE": str(machines * local_world_size),
              "GROUP_RANK": str(machine), "MASTER_ADDR": "node-0"}
    for name in draw(st.lists(st.sampled_from(sorted(others)), unique=True)):
        env[name] = others[name]
    want = f"cuda:{local_rank}" if gpus >= local_world_size else "cpu"
    return env, gpus, want


def _placements(module, cases):
    results = []
    for env, gpus, _ in cases:
        before = dict(env)
        device = module.device_for_rank(env, gpus)
        results.append([type(device).__name__, str(device), dict(env) == before])
    return results


@pytest.mark.points(2)
@settings(max_examples=8)
@given(cases=st.lists(_placement(), min_size=1, max_size=8))
@example(cases=PLACEMENTS)
def test_device_for_rank_uses_the_local_rank(cases):
    got = run("ex01", _placements, cases)
    for (env, gpus, want), (kind, device, env_kept) in zip(cases, got):
        assert device == want, f"env {env} with {gpus} GPUs: expected {want}, got {device}"
        assert kind == "device", f"env {env}: return a torch.device, not a {kind}"
        assert env_kept, f"env {env}: read the environment, do not change it"


BAD_ENVS = [
    # (env, gpu_count, a word the message must contain)
    ({"RANK": "0", "WORLD_SIZE": "2"}, 2, "local_rank"),             # not started by torchrun
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, 2, "local_rank"),  # rank out of range
    ({"LOCAL_RANK": "zero", "LOCAL_WORLD_SIZE": "2"}, 2, "local_rank"),
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, -1, "gpu"),
    ({"LOCAL_RANK": "-1", "LOCAL_WORLD_SIZE": "2"}, 2, "local_rank"),  # negative
    ({"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "2"}, 0, "local_rank"),   # beyond the ranks, on a machine without GPUs
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "0"}, 0, "local_world_size"),
    ({"LOCAL_RANK": "0"}, 1, "local_world_size"),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "two"}, 4, "local_world_size"),
]


@st.composite
def _bad_env(draw):
    """One thing wrong with an otherwise valid (env, gpu_count): (env, gpu_count, the word its message needs)."""
    local_world_size = draw(st.integers(1, 8))
    env = {"LOCAL_RANK": str(draw(st.integers(0, local_world_size - 1))), "LOCAL_WORLD_SIZE": str(local_world_size)}
    gpus = draw(st.integers(0, 9))
    if draw(st.booleans()):
        env["RANK"] = env["LOCAL_RANK"]
    fault = draw(st.sampled_from(["missing", "not_a_number", "rank_too_big", "rank_negative", "no_ranks", "gpus"]))
    name = draw(st.sampled_from(["LOCAL_RANK", "LOCAL_WORLD_SIZE"]))
    if fault == "missing":
        del env[name]
    elif fault == "not_a_number":
        env[name] = draw(st.sampled_from(["", "one", "1.5", "cuda:0", "0x"]))
    elif fault == "rank_too_big":
        name, env["LOCAL_RANK"] = "LOCAL_RANK", str(local_world_size + draw(st.integers(0, 3)))
    elif fault == "rank_negative":
        name, env["LOCAL_RANK"] = "LOCAL_RANK", str(draw(st.integers(-3, -1)))
    elif fault == "no_ranks":
        name, env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"] = "LOCAL_WORLD_SIZE", "0", str(draw(st.integers(-2, 0)))
    else:
        name, gpus = "gpu", draw(st.integers(-3, -1))
    return env, gpus, name.lower()


def _bad_envs(module, cases):
    return [exception_raised_by(module.device_for_rank, env, gpus) for env, gpus, _ in cases]


@pytest.mark.points(1)
@settings(max_examples=6)
@given(cases=st.lists(_bad_env(), min_size=1, max_size=8))
@example(cases=BAD_ENVS)
def test_device_for_rank_rejects_bad_input_with_a_helpful_message(cases):
    got = run("ex01", _bad_envs, cases)
    for (env, gpus, word), (kind, message) in zip(cases, got):
        assert kind == "ValueError", f"env {env}, gpu_count {gpus}: expected ValueError, got {kind}"
        assert word in message.lower(), f"env {env}, gpu_count {gpus}: the message should mention {word!r}: {message!r}"
        if word != "gpu" and not {"LOCAL_RANK", "LOCAL_WORLD_SIZE"} <= set(env):
            assert "torchrun" in message.lower(), (
                f"env {env}: when LOCAL_RANK or LOCAL_WORLD_SIZE is missing, say how to start ranks (torchrun): "
                f"{message!r}")
