"""DDP's step drawn, and the explorer whose menus and sliders redraw it (notebook 05).

    draw_ddp_step(...)    the scaling curve and the bucket timeline of one setting, drawn; the step printed
    ddp_explorer(...)     menus and sliders (model, GPUs, link, bucket size, overlap, compute) that redraw it

The model they draw is ddp.py's (ddp_step_time, bucket_schedule, scaling_curve), and both are imported from there
too: `from course_lib.parallel.ddp import ddp_explorer`. matplotlib and ipywidgets are imported only when something
is drawn.
"""

from __future__ import annotations

import numbers
from typing import Mapping, Sequence

from course_lib.parallel.ddp import (DEFAULT_COMPUTE_MS, LINKS, MODELS, Link, StepEstimate, _count, _real,
                                     bucket_schedule, ddp_step_time, scaling_curve)
from course_lib.parallel.streams import draw_timeline
from course_lib.sliders import log_slider
from course_lib.tables import plural

__all__ = ["draw_ddp_step", "ddp_explorer"]

_GPU_CHOICES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
_BUCKET_CHOICES = [0, 1, 5, 10, 25, 50, 100, 250, 1000]  # MiB; 0: one bucket per parameter


def _as_gradient_bytes(name: str, model) -> list[int]:
    """A model given by its gradient bytes per parameter, or by a parameter count (fp32, in 64 equal tensors)."""
    if isinstance(model, numbers.Number) and not isinstance(model, bool):
        count = _count(model, f"{name}'s parameter count")
        if count < 1:
            raise ValueError(f"{name}: need 1 or more parameters, not {count}")
        pieces = min(64, count)
        return [4 * (count // pieces + (i < count % pieces)) for i in range(pieces)]
    sizes = [_count(b, f"{name}'s gradient bytes") for b in model]
    if not sizes or min(sizes) < 0:
        raise ValueError(f"{name}: need gradient bytes >= 0 for 1 or more parameters")
    return sizes


def draw_ddp_step(grad_bytes_per_param: Sequence[int], compute_s: float, n: int, link: Link, *,
                  bucket_cap_mb: float = 25.0, overlap: bool = True, first_bucket_mb: float = 1.0,
                  measured: Mapping[int, float] | None = None, title: str = "") -> StepEstimate:
    """Draw the predicted efficiency against GPUs and the bucket timeline on n GPUs; print the step (notebook 05)."""
    import matplotlib.pyplot as plt

    kw = dict(bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first_bucket_mb)
    gpus = sorted(set(_GPU_CHOICES) | set(measured or ()) | {n})
    fig, (curve, timeline) = plt.subplots(2, 1, figsize=(9, 6.2), height_ratios=[3, 2], layout="constrained")
    for setting in (overlap, not overlap):  # the chosen setting solid, the other dashed; each keeps its colour
        points = scaling_curve(grad_bytes_per_param, compute_s, link, gpus, overlap=setting, **kw)
        label = "MODEL, all-reduce overlapped with backward" if setting else "MODEL, all-reduce after backward"
        style = dict(marker="o", linewidth=2) if setting == overlap else dict(linestyle="--", linewidth=1, alpha=0.7)
        curve.plot([g for g, _ in points], [e.efficiency for _, e in points], label=label,
                   color="tab:blue" if setting else "tab:orange", **style)
    estimate = ddp_step_time(grad_bytes_per_param, compute_s, n, link, overlap=overlap, **kw)
    curve.plot([n], [estimate.efficiency], "o", markersize=11, markerfacecolor="none", color="black",
               label=f"{plural(n, 'GPU')}: {estimate.efficiency:.0%}")
    if measured:
        ranks = sorted(measured)
        curve.plot(ranks, [measured[r] for r in ranks], "s", color="tab:red", markersize=8,
                   label="measured on this machine (CPU, gloo)")
    curve.set_xscale("log", base=2)
    curve.set_xticks(gpus, [str(g) for g in gpus])
    curve.set_ylim(0, max([1.05] + [1.05 * e for e in (measured or {}).values()]))  # measured can beat 1
    curve.set(xlabel="GPUs (ranks)", ylabel="per-GPU efficiency (1 = perfect)",
              title=title or f"MODEL · scaling over {link.name}")
    curve.grid(alpha=0.3)
    curve.legend(loc="lower left", fontsize=8)
    spans = bucket_schedule(grad_bytes_per_param, compute_s, n, link, overlap=overlap, **kw)
    buckets = sum(1 for s in spans if s.lane == "all-reduce")
    how = "overlapped with backward" if overlap else "after backward"
    draw_timeline(spans, ax=timeline, lanes=["compute", "all-reduce"], unit="ms",
                  title=f"MODEL · one step on {plural(n, 'GPU')}: {plural(buckets, 'all-reduce')} {how}")
    plt.show()
    ms = 1e3
    print(f"MODEL, {plural(n, 'GPU')} over {link.name}: {plural(buckets, 'bucket')} "
          f"(first {first_bucket_mb:g} MiB, then {bucket_cap_mb:g} MiB)\n"
          f"step {estimate.step_s * ms:.3g} ms = compute {estimate.compute_s * ms:.3g} ms + exposed all-reduce "
          f"{estimate.exposed_comm_s * ms:.3g} ms (of {estimate.comm_s * ms:.3g} ms); "
          f"efficiency {estimate.efficiency:.1%}")
    return estimate


def ddp_explorer(measured: Mapping[int, float] | None = None,
                 model_params: Mapping[str, Sequence[int] | int] | None = None, *, fitted: Link | None = None,
                 model: str | None = None, gpus: int = 8, link: str | None = None, bucket_cap_mb: float = 25,
                 overlap: bool = True, compute_ms: float = DEFAULT_COMPUTE_MS):
    """Menus and sliders (model, GPUs, link, bucket size, overlap, compute time) that redraw the model (notebook 05).

    compute_ms defaults to DEFAULT_COMPUTE_MS, 34.5 ms: a ResNet-50 step (batch 128, bf16 autocast) measured on a lent
    H100 with torch 2.11 for this course (see the constant for its conditions and the H200 record beside it).

    measured: {ranks: efficiency measured here}, drawn beside the prediction as "measured on this machine (CPU,
    gloo)". model_params: {name: gradient bytes per parameter (parameter_bytes(model)), or a parameter count,
    taken as fp32 in 64 equal tensors}; MODELS by default. fitted: a Link from fit_link, offered first in the menu
    of links. Returns the widget; its .result is the last StepEstimate drawn.
    """
    import ipywidgets as widgets

    given = MODELS if model_params is None else model_params
    models = {name: _as_gradient_bytes(name, m) for name, m in given.items()}
    if not models:
        raise ValueError("model_params is empty: give at least one model")
    for ranks, efficiency in (measured or {}).items():
        if _count(ranks, "a measured rank count") < 1 or not (_real(efficiency) and efficiency >= 0):
            raise ValueError(f"measured maps rank counts >= 1 to efficiencies >= 0, not {ranks!r}: {efficiency!r}")
    if fitted is not None and not isinstance(fitted, Link):
        raise ValueError(f"fitted must be a Link (from fit_link), not {type(fitted).__name__}")
    links = ({fitted.name: fitted} if fitted is not None else {}) | {k: v for k, v in LINKS.items()
                                                                      if fitted is None or k != fitted.name}
    model = model if model is not None else (next(iter(models)) if model_params else "ResNet-50 (25.6M)")
    link = link if link is not None else "NVLink, 8×H100 node"
    if model not in models or link not in links:
        raise ValueError(f"unknown model {model!r} or link {link!r}")
    gpu_choices = sorted(set(_GPU_CHOICES) | set(measured or ()) | {gpus})
    bucket_choices = sorted(set(_BUCKET_CHOICES) | {bucket_cap_mb})
    wide = {"description_width": "initial"}

    def show(model, gpus, link, bucket_cap_mb, overlap, compute_ms):
        # DDP's default (bucket_cap_mb left out: 25 MiB) has a 1 MiB first bucket; any cap passed explicitly, none
        first = 1.0 if bucket_cap_mb == 25 else bucket_cap_mb
        return draw_ddp_step(models[model], compute_ms / 1e3, gpus, links[link], bucket_cap_mb=bucket_cap_mb,
                             first_bucket_mb=first, overlap=overlap, measured=measured,
                             title=f"MODEL · {model} over {link}")

    return widgets.interactive(
        show,
        model=widgets.Dropdown(options=list(models), value=model, description="model", style=wide),
        gpus=widgets.SelectionSlider(options=gpu_choices, value=gpus, description="GPUs", style=wide),
        link=widgets.Dropdown(options=list(links), value=link, description="link", style=wide,
                              layout=widgets.Layout(width="420px")),
        bucket_cap_mb=widgets.SelectionSlider(options=bucket_choices, value=bucket_cap_mb,
                                              description="bucket_cap_mb (0: per parameter)", style=wide),
        overlap=widgets.Checkbox(value=overlap, description="overlap all-reduce with backward", style=wide),
        # from 0.1 to 10^4 ms, starting at compute_ms (a plain FloatLogSlider would show 34.5 as 35.5 in the browser)
        compute_ms=log_slider(compute_ms, min(0.1, compute_ms), max(1e4, compute_ms),
                              description="compute per step (ms)", style=wide),
    )
