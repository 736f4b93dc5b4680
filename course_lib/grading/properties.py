"""Generated inputs for graded tests: the course's Hypothesis profiles and the strategies exercises share (issue 20).

A graded test states a property over inputs Hypothesis draws, and compares each result with a reference the
test computes itself (torch's own function, or plain Python):

    from hypothesis import given, settings
    from course_lib.grading.properties import nested, batch_tensors, device_lists

    @pytest.mark.points(2)
    @settings(max_examples=8)
    @given(cases=st.lists(nested(batch_tensors(4)), min_size=1, max_size=4))
    def test_something(cases):
        got = run("ex03", _driver, cases)        # one child process for the whole list of cases
        ...

Each example costs a child process (about 0.1 s warm), so a test draws a *list* of cases per example and
keeps `max_examples` small; the cases still shrink to the smallest failing one, which Hypothesis prints as
"Falsifying example" and `check` shows under the table.

The Hypothesis profile (derandomized, no deadline, no example database; `COURSE_HYPOTHESIS=selfcheck` turns
shrinking off for the course's own runs) is loaded by the plugin: course_lib.grading.plugin.load_hypothesis_profile.
"""

from __future__ import annotations

from collections import OrderedDict, UserDict, defaultdict
from functools import partial
from types import SimpleNamespace

import torch
from hypothesis import strategies as st

from course_lib.grading.nesting import Pair, Triple, describe
from course_lib.grading.plugin import PROFILE_VARIABLE, load_hypothesis_profile as load_profile

__all__ = ["PROFILE_VARIABLE", "load_profile", "Pair", "Triple", "CONTAINERS", "nested", "batch_tensors",
           "plain_values", "device_lists", "DTYPES", "describe"]

_KEYS = st.sampled_from(["x", "y", "mask", "ids", "label", "meta"])


def _dicts(kind, children):
    return st.dictionaries(_KEYS, children, max_size=3).map(lambda d: kind(d) if kind is not dict else d)


def _defaultdicts(children):
    return st.dictionaries(_KEYS, children, max_size=3).map(lambda d: defaultdict(list, d))


# Each container kind, as a function from the strategy of its children to a strategy of containers.
CONTAINERS = {
    "list": lambda children: st.lists(children, max_size=3),
    "tuple": lambda children: st.lists(children, max_size=3).map(tuple),
    "dict": partial(_dicts, dict),
    "OrderedDict": partial(_dicts, OrderedDict),
    "defaultdict": _defaultdicts,
    "UserDict": partial(_dicts, UserDict),
    "Pair": lambda children: st.builds(Pair, children, children),
    "Triple": lambda children: st.builds(Triple, children, children, children),
}


def nested(leaves: st.SearchStrategy, containers: tuple[str, ...] | None = None,
           max_leaves: int = 6) -> st.SearchStrategy:
    """Values built from `leaves` nested in containers (the names in CONTAINERS; all of them by default)."""
    kinds = [CONTAINERS[name] for name in (containers or tuple(CONTAINERS))]
    return st.recursive(leaves, lambda children: st.one_of(*(kind(children) for kind in kinds)),
                        max_leaves=max_leaves)


DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool)


@st.composite
def _tensor(draw, rows: int | None, dtypes, non_contiguous: bool):
    trailing = draw(st.lists(st.integers(0, 3), max_size=2))
    shape = ([rows] if rows is not None else []) + trailing
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(-8, 9, shape, generator=generator)
    tensor = (values > 0) if dtype is torch.bool else values.to(dtype)
    if non_contiguous and len(shape) >= 2 and draw(st.booleans()):
        # the same values, laid out transposed in memory: .view() on it fails, .reshape() copies
        tensor = tensor.transpose(-1, -2).contiguous().transpose(-1, -2)
    return tensor


def batch_tensors(rows: int | None = None, dtypes=DTYPES, non_contiguous: bool = True) -> st.SearchStrategy:
    """Small tensors with `rows` rows (dim 0), any rows when None; integer, bool, fp32, fp64 and bf16."""
    return _tensor(rows, dtypes, non_contiguous)


def plain_values() -> st.SearchStrategy:
    """Non-tensor leaves a batch carries along: numbers, strings, None, and a plain mutable object."""
    return st.one_of(st.none(), st.integers(-3, 3), st.text("abc", max_size=3),
                     st.builds(SimpleNamespace, scale=st.floats(0, 2, allow_nan=False)))


def device_lists(min_size: int = 1, max_size: int = 4) -> st.SearchStrategy:
    """Lists of devices that mix "cpu" with "meta", the stand-in for a second device (shapes, no data)."""
    return st.lists(st.sampled_from(["cpu", "meta"]), min_size=min_size, max_size=max_size)
