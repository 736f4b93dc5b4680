"""course_lib.compat on the running torch (any of 2.11 to 2.14): the built-in's answers, no deprecation warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from course_lib.dist import launch


def _gather_and_scatter(rank, world_size):
    import torch.distributed as dist

    from course_lib import compat

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning (a deprecated name) fails here
        mine = torch.tensor([10.0 * rank, 10.0 * rank + 1])
        flat = torch.empty(2 * world_size)
        compat.all_gather_single(flat, mine)
        full = torch.arange(2.0 * world_size) + 100 * rank
        piece = torch.empty(2)
        compat.reduce_scatter_single(piece, full)
    reference = full.clone()
    dist.all_reduce(reference)
    return {"gathered": flat, "scattered": piece, "reference": reference[2 * rank: 2 * rank + 2]}


@pytest.mark.parametrize("world_size", [2, 3])
def test_compat_names_give_the_collectives_answers_without_warnings(world_size):
    results = launch(_gather_and_scatter, world_size, quiet=True)
    expected = torch.tensor([[10.0 * r, 10.0 * r + 1] for r in range(world_size)]).flatten()
    for result in results:
        torch.testing.assert_close(result["gathered"], expected)
        torch.testing.assert_close(result["scattered"], result["reference"])


def test_compat_looks_the_collective_up_when_called(monkeypatch):
    # The graded tests switch built-in collectives off inside ranks by replacing them on torch.distributed.
    import torch.distributed as dist

    from course_lib import compat

    def refused(*args, **kwargs):
        raise RuntimeError("switched off")

    for name in ("all_gather_single", "all_gather_into_tensor"):
        if hasattr(dist, name):
            monkeypatch.setattr(dist, name, refused)
    with pytest.raises(RuntimeError, match="switched off"):
        compat.all_gather_single(torch.empty(2), torch.empty(1))
