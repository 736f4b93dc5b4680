"""launch() from a real Jupyter kernel: functions defined in cells, 2 and 4 ranks, and each failure case."""

from __future__ import annotations

import nbformat
import pytest

from notebook_runner import execute, problems, text_of

CELLS = [
    # 0: a helper and a rank function, both defined in cells (not importable by any other process)
    """
import time, torch, torch.distributed as dist
from course_lib.dist import launch, RankFailed, LaunchTimeout

def scale(x):
    return 10 * x

def total(rank, world_size):
    t = torch.tensor([float(scale(rank))])
    dist.all_reduce(t)
    print(f"rank {rank} sees {t.item():g}")
    return t.item()
""",
    "print('RESULT2', launch(total, 2))",
    "print('RESULT4', launch(total, 4))",
    """
def broken(rank, world_size):
    if rank == 1:
        raise ZeroDivisionError("rank 1 divided by zero")
    dist.barrier()
start = time.monotonic()
try:
    launch(broken, 2, timeout=60)
except RankFailed as error:
    print('RAISED', type(error).__name__, 'rank', error.rank, 'after', round(time.monotonic() - start, 1), 's')
    print(error)
""",
    """
def mismatched(rank, world_size):
    if rank == 0:
        dist.barrier()
    else:
        dist.all_reduce(torch.ones(1))
        time.sleep(100)
start = time.monotonic()
try:
    launch(mismatched, 2, timeout=4)
except LaunchTimeout as error:
    print('TIMEOUT after', round(time.monotonic() - start, 1), 's:', error)
""",
    """
import sys, os
def exits(rank, world_size, how):
    if rank == 1:
        sys.exit(0) if how == 'sys' else os._exit(0)
    return 'fine'
for how in ('sys', 'os'):
    try:
        launch(exits, 2, how)
        print('EXIT-SUCCEEDED', how)
    except RankFailed as error:
        print('EXIT-FAILED', how, 'rank', error.rank)
""",
]


@pytest.mark.timeout(300)
def test_launch_from_notebook_cells(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.strip()) for c in CELLS])
    execute(notebook, cwd=tmp_path)
    assert problems(notebook) == []
    out = [text_of(cell) for cell in notebook.cells]
    assert "RESULT2 [10.0, 10.0]" in out[1]
    assert "[rank 0] rank 0 sees 10" in out[1] and "[rank 1] rank 1 sees 10" in out[1]
    assert "RESULT4 [60.0, 60.0, 60.0, 60.0]" in out[2]
    assert "[rank 3] rank 3 sees 60" in out[2]
    assert "RAISED RankFailed rank 1" in out[3] and "rank 1 divided by zero" in out[3]
    seconds = float(out[3].split("after ")[1].split(" s")[0])
    assert seconds < 30, "a failing rank must be reported promptly, not at the 60 s timeout"
    assert "TIMEOUT after" in out[4] and "all 2 ranks were killed" in out[4]
    assert "EXIT-FAILED sys rank 1" in out[5] and "EXIT-FAILED os rank 1" in out[5]
    assert "EXIT-SUCCEEDED" not in out[5]
