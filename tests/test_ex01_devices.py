"""Graded tests for exercise 01 (notebooks/01_devices_and_memory.ipynb)."""

import json

import pytest
import torch
from torch import nn

from course_lib.data import small_mlp
from course_lib.grading import exception_raised_by, run
from course_lib.memory import saved_activation_bytes

# ---------------------------------------------------------------- to_device


def _describe(value):
    """Plain-data picture of a nested batch: types, tensor devices/shapes/values, and non-tensor values."""
    if isinstance(value, torch.Tensor):
        return {"tensor": value.device.type, "shape": list(value.shape), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {"dict": type(value).__name__, "items": [[k, _describe(v)] for k, v in value.items()]}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {"namedtuple": type(value).__name__, "fields": list(value._fields), "items": [_describe(v) for v in value]}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_describe(v) for v in value]}
    return {"value": repr(value), "type": type(value).__name__}


def _nested_batch():
    from collections import OrderedDict, namedtuple

    Pair = namedtuple("Pair", ["image", "label"])
    return {
        "pixels": torch.ones(2, 3),
        "ordered": OrderedDict([("z", torch.ones(1)), ("a", 3)]),  # stays an OrderedDict, keys in this order
        "meta": {"ids": [7, "a", None], "mask": torch.zeros(4, dtype=torch.bool)},
        "pairs": [Pair(torch.arange(3), 1), Pair(torch.arange(2.0), "x")],
        "shape": (torch.tensor(5), 2.5),
        "name": "batch-0",
    }


def _move_nested(module, device):
    batch = _nested_batch()
    before = _describe(batch)
    moved = module.to_device(batch, device)
    same_objects = moved["name"] is batch["name"] and moved["meta"]["ids"][1] is batch["meta"]["ids"][1]
    return {"before": before, "after_input": _describe(batch), "moved": _describe(moved),
            "same_objects": bool(same_objects), "values": moved["pairs"][0].image.to("cpu")
            if moved["pairs"][0].image.device.type != "meta" else None}


def _on(description, device):
    """The expected picture after a move: every tensor's device replaced, nothing else changed."""
    return json.loads(json.dumps(description).replace('"tensor": "cpu"', f'"tensor": "{device}"'))


DEVICES = ["meta", torch.device("meta"), "cpu"]  # the meta device: tensors with shapes but no data, on any machine


def _move_to_each(module, devices):
    return [_move_nested(module, device) for device in devices]


@pytest.mark.points(3)
def test_to_device_moves_every_tensor_and_keeps_the_structure():
    reference = _describe(_nested_batch())
    for device, got in zip(DEVICES, run("ex01", _move_to_each, DEVICES)):
        assert got["before"] == reference
        assert got["after_input"] == reference, "the input batch must be left unchanged (return a new structure)"
        assert got["moved"] == _on(reference, torch.device(device).type), (
            f"to {device!r}: every tensor must move and every container keep its type, keys and order; "
            "non-tensors stay as they are")
        assert got["same_objects"], "non-tensor values should come back as the very same objects"
        if got["values"] is not None:
            torch.testing.assert_close(got["values"], torch.arange(3))


def _bad_device(module):
    return exception_raised_by(module.to_device, {"x": torch.ones(1)}, 3.5)


def _bad_device_on_a_batch_without_tensors(module):
    try:
        module.to_device({"ids": [1, 2]}, 3.5)
        return "returned"
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__


def _bad_device_both(module):
    return [_bad_device(module), _bad_device_on_a_batch_without_tensors(module)]


@pytest.mark.points(1)
def test_to_device_rejects_a_device_that_is_not_a_device():
    (kind, message), without_tensors = run("ex01", _bad_device_both)
    assert kind == "TypeError", f"expected TypeError for device=3.5, got {kind}"
    assert "device" in message.lower(), "the message should say what a device must be"
    assert without_tensors == "TypeError", (
        f"device=3.5 with a batch that holds no tensor: expected TypeError, got {without_tensors} "
        "(check the device first, not only when a tensor is found)")


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


def _build(case, measure_step=None):
    """A model and optimizer after one training step; built identically in the child and in the test.

    `measure_step`, if given, is a context manager entered around optimizer.step() (the test's measurement).
    """
    torch.manual_seed(0)
    if case == "batchnorm":
        model = _WithBuffers()
        x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    elif case == "tied":
        model = _Tied()
        x, y = torch.randint(0, 11, (5,)), torch.randint(0, 11, (5,))
    else:
        model = small_mlp(8, 16, 4, 2)
        x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    if case == "bf16_adamw":
        model = model.to(torch.bfloat16)
        x = x.to(torch.bfloat16)
    if case == "frozen_first_layer_sgd":
        for p in model[0].parameters():
            p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = {
        "adam": lambda: torch.optim.Adam(trainable, lr=1e-3),
        "tied": lambda: torch.optim.Adam(trainable, lr=1e-3),
        "bf16_adamw": lambda: torch.optim.AdamW(trainable, lr=1e-3),
        "sgd_momentum": lambda: torch.optim.SGD(trainable, lr=0.1, momentum=0.9),
        "sgd_plain": lambda: torch.optim.SGD(trainable, lr=0.1),
        "frozen_first_layer_sgd": lambda: torch.optim.SGD(trainable, lr=0.1, momentum=0.9),
        "adam_after_zero_grad": lambda: torch.optim.Adam(trainable, lr=1e-3),
        "batchnorm": lambda: torch.optim.Adam(trainable, lr=1e-3),
    }[case]()
    loss = nn.functional.cross_entropy(model(x).float(), y)
    loss.backward()
    if measure_step is None:
        optimizer.step()
    else:
        with measure_step:
            optimizer.step()
    if case == "adam_after_zero_grad":
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def _state_bytes(module, cases):
    results = []
    for case in cases:
        model, optimizer = _build(case)
        got = module.training_state_bytes(model, optimizer)
        results.append({k: int(v) for k, v in dict(got).items()})
    return results


CASES = ["adam", "sgd_momentum", "sgd_plain", "bf16_adamw", "frozen_first_layer_sgd", "tied", "adam_after_zero_grad",
         "batchnorm"]


def _new_memory_kept():
    """A TorchDispatchMode that notes every tensor made while it is active; kept_bytes() measures what survives.

    Around optimizer.step(), what survives is what the optimizer allocated and keeps: its states. Measured from
    the allocations themselves, so the reference does not depend on how optimizer.state is laid out.
    """
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    class MemoryKept(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False  # the default wraps __torch_dispatch__ with torch._dynamo, whose import takes seconds

        def __init__(self):
            super().__init__()
            self.made, self.before = [], set()

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


def _reference_bytes(case):
    """Measured from memory: distinct storages of the parameters and gradients, and what the step allocated."""
    measure = _new_memory_kept()
    model, optimizer = _build(case, measure_step=measure)
    params = [p for m in model.modules() for p in m._parameters.values() if p is not None]
    grads = [p.grad for p in params if p.grad is not None]

    def storage_bytes(tensors):
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())

    return {"parameters": storage_bytes(params), "gradients": storage_bytes(grads),
            "optimizer_states": measure.kept_bytes(params + grads)}


@pytest.mark.points(4)
def test_training_state_bytes_matches_the_tensors():
    for case, got in zip(CASES, run("ex01", _state_bytes, CASES)):
        expected = _reference_bytes(case)
        assert set(got) == set(expected), f"return exactly the keys {sorted(expected)}"
        for key in expected:
            assert got[key] == expected[key], f"{case}: {key} should be {expected[key]} bytes, got {got[key]}"


def _bad_state_args(module):
    model = small_mlp(4, 4, 2, 1)
    cases = [(model, "adam"), ("model", torch.optim.SGD(model.parameters(), lr=0.1))]
    return [exception_raised_by(module.training_state_bytes, *args)[0] for args in cases]


@pytest.mark.points(1)
def test_training_state_bytes_rejects_wrong_types():
    assert run("ex01", _bad_state_args) == ["TypeError", "TypeError"]


# ---------------------------------------------------------------- mlp_activation_bytes


def _measured_activation_bytes(batch_size, features, hidden, classes, depth, dtype):
    """What autograd really saves: every saved tensor's storage once, parameters left out."""
    torch.manual_seed(0)
    model = small_mlp(features, hidden, classes, depth).to(dtype)
    return saved_activation_bytes(model, torch.randn(batch_size, features, dtype=dtype))


SIZES = [(8, 32, 64, 10, 2, torch.float32), (16, 5, 7, 3, 1, torch.float32), (4, 32, 64, 10, 3, torch.bfloat16),
         (1, 3, 300, 1000, 4, torch.float64), (64, 20, 20, 2, 1, torch.float16)]


def _estimates(module, sizes):
    return [int(module.mlp_activation_bytes(*args)) for args in sizes]


@pytest.mark.points(3)
def test_mlp_activation_bytes_matches_what_autograd_saves():
    got = run("ex01", _estimates, SIZES)
    for args, estimate in zip(SIZES, got):
        measured = _measured_activation_bytes(*args)
        assert estimate == measured, (f"batch, features, hidden, classes, depth, dtype = {args}: autograd saved "
                                      f"{measured} bytes, the estimate was {estimate}")


def _bad_sizes(module):
    cases = [(0, 4, 4, 2, 1), (4, 4, 4, 2, 0), (4, -1, 4, 2, 1)]
    return [exception_raised_by(module.mlp_activation_bytes, *args)[0] for args in cases]


@pytest.mark.points(1)
def test_mlp_activation_bytes_rejects_bad_sizes():
    assert run("ex01", _bad_sizes) == ["ValueError"] * 3


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
]


def _placements(module, cases):
    return [[type(device).__name__, str(device)] for device in (module.device_for_rank(env, gpus) for env, gpus, _ in cases)]


@pytest.mark.points(2)
def test_device_for_rank_uses_the_local_rank():
    got = run("ex01", _placements, PLACEMENTS)
    for (env, gpus, want), (kind, device) in zip(PLACEMENTS, got):
        assert device == want, f"env {env} with {gpus} GPUs: expected {want}, got {device}"
        assert kind == "device", f"env {env}: return a torch.device, not a {kind}"


BAD_ENVS = [
    ({"RANK": "0", "WORLD_SIZE": "2"}, 2, "local_rank"),             # not started by torchrun
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, 2, "local_rank"),  # rank out of range
    ({"LOCAL_RANK": "zero", "LOCAL_WORLD_SIZE": "2"}, 2, "local_rank"),
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, -1, "gpu"),
]


def _bad_envs(module, cases):
    return [exception_raised_by(module.device_for_rank, env, gpus) for env, gpus, _ in cases]


@pytest.mark.points(1)
def test_device_for_rank_rejects_bad_input_with_a_helpful_message():
    got = run("ex01", _bad_envs, BAD_ENVS)
    for (env, gpus, word), (kind, message) in zip(BAD_ENVS, got):
        assert kind == "ValueError", f"env {env}, gpu_count {gpus}: expected ValueError, got {kind}"
        assert word in message.lower(), f"env {env}, gpu_count {gpus}: the message should mention {word!r}: {message!r}"
    assert "torchrun" in got[0][1].lower(), "when LOCAL_RANK is missing, say how to start ranks (torchrun)"
