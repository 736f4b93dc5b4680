"""What the learner's toolkit shows in a notebook: short lines, one table cell per hint, pictures without Out[n]."""

from __future__ import annotations

import base64
import re

import pytest

from course_lib import devices, diagrams
from course_lib.check import CheckResult
from course_lib.dist.launcher import RankFailed
from course_lib.grading.results import TestOutcome
from course_lib.timing import QUICK_VARIABLE, quick

WIDTH = 100  # characters: a notebook's output area breaks longer lines mid-word at 1280 px


@pytest.mark.parametrize("value, expected", [(None, False), ("", False), ("0", False), ("false", False),
                                             ("no", False), ("1", True), ("yes", True), ("true", True)])
def test_quick_reads_course_quick(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(QUICK_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(QUICK_VARIABLE, value)
    assert quick() is expected


def _longest_line(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_messages_without_a_gpu_fit_a_notebook_line(monkeypatch, capsys):
    monkeypatch.setattr(devices, "cuda_gpu_count", lambda: 0)
    devices.print_hardware_report()
    devices.require_gpus(2, "measure a training step's memory with torch.cuda.memory_allocated and compare it "
                            "with the prediction made from the parameter count above")
    devices.gpu_memory_report()
    out = capsys.readouterr().out
    assert _longest_line(out) <= WIDTH, out
    assert "Skipped: this cell needs 2 CUDA GPUs and this machine has 0." in out


def test_rank_failed_drops_the_build_machines_source_path():
    detail = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
              "Timed out waiting 2000ms for recv operation to complete\n")
    error = RankFailed(0, 2, detail)
    assert "RuntimeError: Timed out waiting 2000ms for recv" in str(error)
    assert "/__w/" not in str(error) and "unbound_buffer" not in error.detail
    assert "[rank0]: [x.py:3]" in str(RankFailed(0, 2, "[rank0]: [x.py:3] a relative path stays"))


def _outcome(test: str, message: str = "", outcome: str = "failed", points: int = 1) -> TestOutcome:
    return TestOutcome(f"tests/test_ex04_collectives.py::{test}", points, outcome, message)


HINT = ("ex04: ring_all_reduce is not implemented yet (hint: follow the docstring; in each step isend() to the "
        "right, recv() from the left)\nFailing explicit example: test_ring(\n    sizes=[3],\n)")
OTHER = "ex04: not implemented yet (hint: divide by 1e9 for GB/s; reuse bus_bandwidth_factor)"  # an older message


def test_check_table_shows_each_hint_once_and_never_breaks_the_result():
    result = CheckResult("ex04", [
        _outcome("test_ring[2]", HINT), _outcome("test_ring[3]", HINT), _outcome("test_ring_rejects", HINT),
        _outcome("test_bandwidths", OTHER), _outcome("test_passes", outcome="passed"),
        _outcome("test_bandwidths_again", OTHER), _outcome("test_bandwidths_more", OTHER),
        _outcome("test_ring_again", HINT + "\nFailing explicit example: test_ring_again(\n    n=4,\n)"),
    ])
    page = result._repr_html_()
    short_hint = HINT.splitlines()[0].removeprefix("ex04: ")
    # The rows of one stub come together, where its first test is, and share one cell: no "(same as above)"
    # that could mean either of two different rows above it.
    assert page.count(short_hint) == 1 and page.count(OTHER.removeprefix("ex04: ")) == 1
    assert page.count("rowspan='3'") == 2    # test_ring [2, 3], _rejects and _again; the three test_bandwidths
    assert "same as" not in page and "Failing" not in page and "sizes=" not in page  # a stub's inputs teach nothing
    assert len(re.findall(r"<tr\b", page)) == 1 + 7                  # header + one row per test group
    names = [name for name, *_ in result._shown_rows()]
    assert names == ["test_ring [2, 3]", "test_ring_rejects", "test_ring_again", "test_bandwidths",
                     "test_bandwidths_again", "test_bandwidths_more", "test_passes"]
    for cell in re.findall(r"<td style='([^']*)'>[^<]*(?:FAILED|passed)</td>", page):
        assert "white-space:nowrap" in cell
    for verbose in (False, True):
        text = result.format(width=WIDTH, verbose=verbose)
        assert " ".join(text.split()).count(short_hint) == 1 and "〃" in text  # wrapped, never cut
        assert max(len(line) for line in text.splitlines()) <= WIDTH and "Failing" not in text


def test_pictures_show_without_an_out_prompt(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, raw=False: shown.append((data, raw)))
    picture = diagrams.collective_picture("all_reduce")
    assert isinstance(picture, diagrams.Picture)
    picture._ipython_display_()            # what IPython calls instead of printing Out[n]: <Figure ...>
    (data, raw), = shown
    assert raw and base64.b64decode(data["image/png"]).startswith(b"\x89PNG")
    assert isinstance(diagrams.draw_ring_all_reduce(4), diagrams.Picture)
    assert isinstance(diagrams.draw_barrier([0.1, 0.3]), diagrams.Picture)



def test_a_function_that_cannot_be_sent_to_the_ranks_is_explained_in_short_lines():
    import threading

    from course_lib.dist import LaunchError, launch

    lock = threading.Lock()
    with pytest.raises(LaunchError) as info:
        launch(lambda rank, world_size: lock, 2, quiet=True)
    assert "cannot be pickled" in str(info.value) and _longest_line(str(info.value)) <= WIDTH, str(info.value)
