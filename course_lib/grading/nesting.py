"""Plain values that graded tests send to a child process and read back: namedtuples and describe() (issue 20).

Kept apart from properties.py, which imports Hypothesis: a child that unpickles a Pair, or a driver that calls
describe(), imports only this module (Hypothesis would add about half a second to every child).
"""

from __future__ import annotations

from collections import UserDict, namedtuple

import torch

__all__ = ["Pair", "Triple", "describe"]

# Defined in the library, so that a child process can unpickle them by reference.
Pair = namedtuple("Pair", ["image", "label"])
Triple = namedtuple("Triple", ["a", "b", "c"])


def describe(value):
    """A plain-data picture of a nested value: what a child can send back (torch.load(weights_only=True)).

    Tensors become their device, dtype and shape (values are compared separately); containers their type
    name and contents; anything else its type name and repr.
    """
    if isinstance(value, torch.Tensor):
        return {"tensor": [value.device.type, str(value.dtype), list(value.shape)]}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {type(value).__name__: [describe(v) for v in value]}
    if isinstance(value, (dict, UserDict)):
        return {type(value).__name__: [[k, describe(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [describe(v) for v in value]}
    return {"value": [type(value).__name__, repr(value)]}
