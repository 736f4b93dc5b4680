"""Reads this process's os.environ instead of the env it is given: every rank sees the same LOCAL_RANK."""

LOSES = ["test_device_for_rank_uses_the_local_rank"]

import os

_solution_device_for_rank = device_for_rank


def device_for_rank(env, gpu_count):
    return _solution_device_for_rank(os.environ, gpu_count)
