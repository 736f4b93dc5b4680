"""Real models cut into pipeline stages: each layer's cost measured, a model split by hand and timed (notebook 07).

    stage_costs, split_by_boundaries, stage_times   each layer's cost measured; a model cut into stages, timed
    naive_split, NaiveSplit, timeline_of_naive_split   consecutive layers on consecutive devices, and when each works

Exercise 07's partitioning of layers into balanced stages is not here: stage_costs and stage_times give it its
inputs. timeline_of_naive_split returns the Ops of schedules.py, measured, for pictures.draw_schedule.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch
from torch import nn

from course_lib.parallel import whole_number
from course_lib.parallel.pipeline.schedules import Op
from course_lib.tables import plural

__all__ = ["stage_costs", "split_by_boundaries", "stage_times", "NaiveSplit", "naive_split", "timeline_of_naive_split"]


def _check_sequential(model) -> nn.Sequential:
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential (a stack of layers to cut), not {type(model).__name__}")
    if len(model) == 0:
        raise ValueError("model is an empty nn.Sequential: give it at least one layer")
    return model


def _check_input(x, what: str = "example_input") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a tensor (one batch for the model), not {type(x).__name__}")
    return x


def _sync(*tensors) -> None:
    for device in {t.device for t in tensors if isinstance(t, torch.Tensor)}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _time_forward_backward(module: nn.Module, x: torch.Tensor, input_grad: bool, repeat: int):
    """Median forward and backward seconds of module on x (after one warm-up), and its output (detached).

    The backward is torch.autograd.grad of the output (times a fixed random gradient) with respect to the module's
    trainable parameters and, when input_grad, its input: the work a pipeline stage does, leaving .grad alone.
    """
    forward, backward = [], []
    inp = x.detach().requires_grad_(input_grad)
    params = _trainable(module)
    out = None
    for r in range(repeat + 1):
        _sync(inp)
        t0 = time.perf_counter()
        out = module(inp)
        _sync(out)
        t1 = time.perf_counter()
        wrt = params + ([inp] if input_grad else [])
        if isinstance(out, torch.Tensor) and out.requires_grad and wrt:
            grad = torch.ones_like(out)
            torch.autograd.grad(out, wrt, grad, allow_unused=True)
            _sync(out)
        t2 = time.perf_counter()
        if r:  # the first run warms up
            forward.append(t1 - t0)
            backward.append(t2 - t1)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"each layer must return one tensor, {type(module).__name__} returned {type(out).__name__}")
    return statistics.median(forward), statistics.median(backward), out.detach()


def stage_costs(model: nn.Sequential, example_input: torch.Tensor, repeat: int = 3) -> list[dict]:
    """Each layer's parameter count and measured forward and backward seconds, on its real input (notebook 07).

    Runs the layers in order on example_input, timing each one on what the layer before it produced (median of
    repeat runs after one warm-up; on a GPU with synchronisation). The backward computes the gradients of the
    layer's weights and, after the first layer with trainable weights, of its input, as in training; .grad is left
    alone. One dict per layer: layer (index), name (its class), parameters, forward_s, backward_s, seconds (the sum).
    """
    model = _check_sequential(model)
    x = _check_input(example_input)
    repeat = whole_number(repeat, "repeat")
    rows, upstream_trainable = [], False
    for index, layer in enumerate(model):
        input_grad = upstream_trainable and x.is_floating_point()
        forward, backward, x = _time_forward_backward(layer, x, input_grad, repeat)
        rows.append({"layer": index, "name": type(layer).__name__,
                     "parameters": sum(p.numel() for p in layer.parameters()),
                     "forward_s": forward, "backward_s": backward, "seconds": forward + backward})
        upstream_trainable = upstream_trainable or bool(_trainable(layer))
    return rows


def split_by_boundaries(model: nn.Sequential, boundaries: Sequence[int]) -> list[nn.Sequential]:
    """The model cut before each boundary index: [4] cuts 8 layers into layers 0–3 and 4–7 (notebook 07).

    Each piece is an nn.Sequential of the same layer objects (not copies), with their names (model[a:b]).
    boundaries: strictly increasing indices between 1 and len(model) − 1; [] gives the whole model as one piece.
    """
    model = _check_sequential(model)
    if isinstance(boundaries, (str, bytes)) or not isinstance(boundaries, Sequence):
        raise TypeError(f"boundaries must be a list of layer indices, not {type(boundaries).__name__}")
    cuts = [whole_number(b, "a boundary", 1, integral_floats=False) for b in boundaries]
    if any(b >= len(model) for b in cuts):
        raise ValueError(f"boundaries must lie between 1 and {len(model) - 1} (the model has "
                         f"{plural(len(model), 'layer')}), not {cuts}")
    if any(a >= b for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"boundaries must be strictly increasing, not {cuts}")
    edges = [0] + cuts + [len(model)]
    return [model[a:b] for a, b in zip(edges, edges[1:])]


def stage_times(stages_modules: Sequence[nn.Module], example_input: torch.Tensor, repeat: int = 3) -> list[float]:
    """Measured forward + backward seconds of each stage, each on the output of the one before (notebook 07).

    As stage_costs does for layers (median of repeat after a warm-up; input gradients from the second stage on,
    when something upstream is trainable): the slowest stage sets a pipeline's pace.
    """
    if isinstance(stages_modules, nn.Module) or not isinstance(stages_modules, Sequence) or not stages_modules:
        raise TypeError("stages_modules must be a non-empty list of modules (split_by_boundaries gives one)")
    for stage in stages_modules:
        if not isinstance(stage, nn.Module):
            raise TypeError(f"each stage must be an nn.Module, not {type(stage).__name__}")
    x = _check_input(example_input)
    repeat = whole_number(repeat, "repeat")
    seconds, upstream_trainable = [], False
    for stage in stages_modules:
        forward, backward, x = _time_forward_backward(stage, x, upstream_trainable and x.is_floating_point(), repeat)
        seconds.append(forward + backward)
        upstream_trainable = upstream_trainable or bool(_trainable(stage))
    return seconds


# ---------------------------------------------------------------------------------------------------- naive split


class NaiveSplit(nn.Module):
    """Consecutive layers on consecutive devices; forward moves the activations along (notebook 07).

    .stages: the pieces (nn.Sequential); .devices: where each one lives; .description: one line saying where they
    are, and whether they are real GPUs or CPU stand-ins. Autograd carries the gradients back across the devices.
    Only one device works at a time: that idle time is what pipelining recovers.
    """

    def __init__(self, stages: Sequence[nn.Sequential], devices: Sequence[torch.device], description: str):
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.devices = [torch.device(d) for d in devices]
        self.description = description

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage, device in zip(self.stages, self.devices):
            x = stage(x.to(device))
        return x


def naive_split(model: nn.Sequential, devices: Sequence | None = None, *,
                boundaries: Sequence[int] | None = None) -> NaiveSplit:
    """Put consecutive layers of model on consecutive devices: the naive model parallelism (notebook 07).

    devices: None for two: cuda:0 and cuda:1 where there are 2 GPUs, else two CPU stand-ins ("cpu", "cpu"),
    which .description says. boundaries (split_by_boundaries): where each piece starts; None cuts the layers into
    equal counts, the first pieces one longer. The layers are moved, not copied: model itself changes device.
    """
    model = _check_sequential(model)
    if devices is None:
        on_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= 2
        devices = ["cuda:0", "cuda:1"] if on_gpus else ["cpu", "cpu"]
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence):
        raise TypeError(f"devices must be a list of devices, like ['cuda:0', 'cuda:1'], not {devices!r}")
    try:
        devices = [torch.device(d) for d in devices]
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"devices must name devices, like 'cuda:0' or 'cpu': {error}") from None
    if len(devices) < 1:
        raise ValueError("devices is empty: give one device per stage")
    if len(devices) > len(model):
        raise ValueError(f"{plural(len(devices), 'device')} but only {plural(len(model), 'layer')}: "
                         "every stage needs at least one layer")
    if boundaries is None:
        k, n = len(devices), len(model)
        sizes = [n // k + (i < n % k) for i in range(k)]
        boundaries = [sum(sizes[:i]) for i in range(1, k)]
    stages = split_by_boundaries(model, boundaries)
    if len(stages) != len(devices):
        raise ValueError(f"{plural(len(boundaries), 'boundary')} make {plural(len(stages), 'stage')} for "
                         f"{plural(len(devices), 'device')}: give one stage per device")
    for stage, device in zip(stages, devices):
        stage.to(device)
    names = ", ".join(str(d) for d in devices)
    counts = " + ".join(str(len(s)) for s in stages)
    what = f"{plural(len(stages), 'stage')} (layers: {counts}) on {names}"
    if all(d.type == "cpu" for d in devices):
        description = (f"{what}: CPU stand-ins for {plural(len(stages), 'GPU')} "
                       f"(fewer than {plural(len(stages), 'GPU')} here); they take turns as GPUs would, but share "
                       "this CPU's cores")
    elif len(set(devices)) == len(devices):
        description = f"{what}: forward moves the activations from each device to the next"
    else:
        description = f"{what}: some stages share a device"

    return NaiveSplit(stages, devices, description)


def timeline_of_naive_split(split: NaiveSplit, inputs: torch.Tensor, targets: torch.Tensor | None = None, *,
                            steps: int = 3, loss_fn: Callable | None = None) -> list[Op]:
    """When each stage of a NaiveSplit computes, measured over a few training steps: Ops in ms (notebook 07).

    Each step: the forward stage by stage (F, including the move of the activations onto the stage's device), the
    loss, then the backward stage by stage from the last (B: the gradients of the stage's weights and of its input,
    which goes to the stage before). Wall-clock times (with synchronisation on a GPU), in ms from the first op;
    Op.micro_batch is the step. One warm-up step is not recorded. Draw with draw_schedule(ops, unit="ms"): one row
    per stage, and only one works at a time. loss_fn(output, targets): MSE by default; targets None: zeros.
    .grad is left alone (torch.autograd.grad).
    """
    if not isinstance(split, NaiveSplit):
        raise TypeError(f"split must be a NaiveSplit (from naive_split), not {type(split).__name__}")
    inputs = _check_input(inputs, "inputs")
    steps = whole_number(steps, "steps")
    loss_fn = loss_fn or nn.functional.mse_loss
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, not {type(loss_fn).__name__}")
    ops: list[tuple[int, int, str, float, float]] = []
    for step in range(-1, steps):
        outputs, kept = [], []
        x = inputs
        for index, (stage, device) in enumerate(zip(split.stages, split.devices)):
            _sync(x)
            t0 = time.perf_counter()
            inp = x.detach().to(device).requires_grad_(index > 0 and x.is_floating_point())
            out = stage(inp)
            _sync(out)
            ops.append((index, step, "F", t0, time.perf_counter()))
            kept.append(inp)
            outputs.append(out)
            x = out
        goal = torch.zeros_like(x) if targets is None else targets.to(x.device)
        grad = torch.autograd.grad(loss_fn(x, goal), x)[0]
        for index in reversed(range(len(split.stages))):
            stage, inp, out = split.stages[index], kept[index], outputs[index]
            _sync(grad)
            t0 = time.perf_counter()
            wrt = _trainable(stage) + ([inp] if inp.requires_grad else [])
            if wrt and out.requires_grad:
                grads = torch.autograd.grad(out, wrt, grad.to(out.device), allow_unused=True)
                grad = grads[-1] if inp.requires_grad else None
            _sync(out)
            ops.append((index, step, "B", t0, time.perf_counter()))
            if grad is None:
                break
    recorded = [o for o in ops if o[1] >= 0]
    t0 = min(o[3] for o in recorded)
    return [Op(stage, step, kind, (start - t0) * 1e3, (end - t0) * 1e3) for stage, step, kind, start, end in recorded]
