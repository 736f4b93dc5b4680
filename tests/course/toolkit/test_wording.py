"""What the toolkit prints says what is true: "1 rank", not "1 ranks"; a recorded GPU figure is "recorded", not "here".

Three kinds of check: (1) the toolkit's printing functions run with counts of 1 and 2 and their output is searched
for a count of 1 before a plural noun; (2) the source of course_lib (the learner's toolkit, dist/ and parallel/;
check.py, grading/ and instructor/ are not covered yet) and of lessons 01-04 is searched for `{count} nouns` in
f-strings that do not go through `course_lib.tables.plural`; (3) what a CPU-only learner is shown from
notebooks/recorded_on_gpu.json never says "here", "this machine" or cites an issue tracker.
"""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path

import nbformat
import pytest

from course_lib import devices, recorded
from course_lib.paths import NOTEBOOKS

ROOT = Path(__file__).resolve().parents[3]
# Nouns the toolkit counts. Units ("1 s", "1 ms") are abbreviations and never plural, so they are not here.
PLURAL_NOUNS = {
    "ranks", "batches", "gpus", "devices", "tests", "points", "processes", "seconds", "cores", "runs", "replicas",
    "functions", "inputs", "chunks", "samples", "threads", "steps", "bytes", "messages", "workers", "nodes",
    "students", "submissions", "files", "mutants", "calls", "copies", "kernels", "tensors", "elements", "layers",
    "parameters", "streams", "events", "lines", "minutes", "hours", "times", "cases", "errors", "items", "sizes",
}
ONE_PLURAL = re.compile(r"(?<![\d.,])\b1 ([A-Za-z-]+)(?: ([A-Za-z]+))?")  # "1 ranks", "1 usable cores", "1 CUDA GPUs"


def slips(text: str) -> list[str]:
    """Each "1 <plural noun>" in `text` (a count of exactly one: not 1.5, 11 or 2,1)."""
    found = []
    for match in ONE_PLURAL.finditer(text):
        first, second = match.group(1), match.group(2)
        if first.lower() in PLURAL_NOUNS:
            found.append(f"1 {first}")
        elif second and second.lower() in PLURAL_NOUNS:
            found.append(f"1 {first} {second}")
    return found


def test_the_slip_finder_finds_slips_and_leaves_units_alone():
    assert slips("all 1 ranks were killed; 1 batches; 1 usable cores; 1 CUDA GPUs here") == [
        "1 ranks", "1 batches", "1 usable cores", "1 CUDA GPUs"]
    assert slips("1 rank · 2 ranks · 1 s · 1.5 seconds · 11 ranks · 1 GPU · 0.1 ms · 2,1 ranks") == []


def test_plural_helper():
    from course_lib.tables import plural

    assert [plural(n, "rank") for n in (0, 1, 2)] == ["0 ranks", "1 rank", "2 ranks"]
    assert plural(1, "batch") == "1 batch" and plural(3, "batch") == "3 batches"
    assert plural(2, "process") == "2 processes" and plural(2, "CUDA GPU") == "2 CUDA GPUs"
    assert plural(2, "replica") == "2 replicas" and plural(2, "entry") == "2 entries" and plural(2, "day") == "2 days"
    assert plural(1, "child", "children") == "1 child" and plural(2, "child", "children") == "2 children"
    assert plural(1, "Rank", number=False) == "Rank" and plural(2, "Rank", number=False) == "Ranks"
    assert plural(1234, "sample", spec=",") == "1,234 samples"


# (1) The toolkit's printing functions, with counts 1 and 2 ------------------------------------------------------


def _sleep(rank, world_size, seconds):
    time.sleep(seconds)


def _hello(rank, world_size):
    print(f"hello from rank {rank}")
    return rank


def test_launch_says_rank_or_ranks(capfd):
    from course_lib.dist import LaunchTimeout, launch

    assert launch(_hello, 1) == [0]
    assert launch(_hello, 2) == [0, 1]
    with pytest.raises(LaunchTimeout) as timeout:
        launch(_sleep, 1, 30.0, timeout=1.0, quiet=True)
    out = capfd.readouterr().out + "\n" + str(timeout.value)
    assert "[launch] 1 rank ·" in out and "[launch] 2 ranks ·" in out, out
    assert slips(out) == [], out


@pytest.mark.parametrize("gpus", [0, 1, 2])
@pytest.mark.parametrize("world_size", [1, 2])
def test_backend_choice_counts_ranks_and_gpus(monkeypatch, gpus, world_size):
    import torch.distributed as dist

    from course_lib.dist import backend

    monkeypatch.setattr(backend, "cuda_gpu_count", lambda: gpus)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    texts = [backend.choose_backend(world_size, None)[1]]
    try:
        texts.append(backend.choose_backend(world_size, "nccl")[1])
    except backend.LaunchError as error:
        texts.append(str(error))
    assert slips("\n".join(texts)) == [], texts


@pytest.mark.parametrize("count", [1, 2])
def test_device_messages_count_gpus_and_cores(monkeypatch, capsys, count):
    report = devices.HardwareReport(cpu_cores=count, cpu_name="test cpu",
                                    gpus=[devices.GPUInfo(i, "Test GPU", 2**30, (9, 0), 132) for i in range(count)],
                                    backends={"nccl": True, "gloo": True, "mpi": False}, cuda_build="13.0")
    devices.print_hardware_report(report)
    monkeypatch.setattr(devices, "cuda_gpu_count", lambda: count - 1)
    devices.require_gpus(count, "do something")
    monkeypatch.setattr(devices, "usable_cores", lambda: count)
    monkeypatch.setattr(devices, "cuda_gpu_count", lambda: 0)
    why = devices.pick_device()[1]
    out = capsys.readouterr().out + "\n" + why
    assert slips(out) == [], out


def test_timing_counts_runs():
    from course_lib.timing import benchmark

    text = str(benchmark(lambda: None, device="cpu", warmup=0, repeat=1))
    assert "1 run on" in text and slips(text) == [], text
    assert "2 runs on" in str(benchmark(lambda: None, device="cpu", warmup=0, repeat=2))


def test_models_and_replicas_count_batches_and_replicas(monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_lib.parallel import data_parallel
    from course_lib.parallel.streams import draw_schedules

    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    texts = []
    for n in (1, 2):
        draw_schedules(4.86, 2.69, n)
        plt.close("all")
        texts.append(data_parallel.replica_devices(n)[1])
        for functions, inputs in ((n, 3 - n), (n, 3)):
            with pytest.raises(ValueError) as error:
                data_parallel.parallel_apply([abs] * functions, [(1,)] * inputs)
            texts.append(str(error.value))
    text = capsys.readouterr().out + "\n" + "\n".join(texts)
    assert "MODEL, 1 batch of copy" in text and "MODEL, 2 batches of copy" in text, text
    assert slips(text) == [], text


def test_diagram_errors_count_ranks():
    from course_lib.diagrams import draw_collective

    with pytest.raises(ValueError) as error:
        draw_collective([["A"]], [["A"], ["B"]])
    assert slips(str(error.value)) == [], str(error.value)


# (2) The source: `{count} nouns` in an f-string, not through plural() -----------------------------------------

# check_result.py writes "earned / possible points" ("1 / 1 points" reads as a share of points, not a count).
TOOLKIT_SOURCES = sorted(p for p in (ROOT / "course_lib").rglob("*.py")
                         if p.name != "check_result.py" and not {"grading", "instructor"} & set(p.parts))
LESSONS = sorted(NOTEBOOKS.glob("0[1-4]_*.ipynb"))


def _decimals(value: ast.FormattedValue) -> bool:
    """True for `{x:.2f}`: a measurement printed with decimals ("1.00 M parameters") is never a count of one."""
    spec = value.format_spec
    text = "".join(part.value for part in spec.values if isinstance(part, ast.Constant)) if spec else ""
    return bool(re.search(r"\.[1-9]\d*[fe%]$", text))


def _count_then_plural(source: str) -> list[str]:
    """`{expr} nouns` in the f-strings of `source`: a count printed before a plural noun, without plural()."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell of IPython magics (%%writefile, helper??)
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        for value, after in zip(node.values, node.values[1:]):
            if isinstance(value, ast.FormattedValue) and isinstance(after, ast.Constant) and not _decimals(value):
                words = re.match(r" ([A-Za-z-]+)\b(?: ([A-Za-z]+)\b)?", after.value)
                if words and {w.lower() for w in words.groups() if w} & PLURAL_NOUNS:
                    found.append(f"line {node.lineno}: {{{ast.unparse(value.value)}}}{after.value[:30]!r}")
    return found


@pytest.mark.parametrize("path", TOOLKIT_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_toolkit_source_counts_through_plural(path):
    assert _count_then_plural(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_code_counts_through_plural(path):
    notebook = nbformat.read(path, as_version=4)
    found = [f"cell {i} {slip}" for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
             for slip in _count_then_plural(cell.source)]
    assert found == []


# (3) Recorded GPU output is labelled as recorded, with its real provenance -------------------------------------

HERE = re.compile(r"\bhere\b|\bthis machine\b", re.IGNORECASE)
NO_PROVENANCE = re.compile(r"issue tracker|date not recorded", re.IGNORECASE)


def test_recorded_blocks_never_say_here(capsys):
    records = recorded.load_records()
    assert records, "notebooks/recorded_on_gpu.json has no records"
    for key in records:
        assert recorded.show_recorded(key)
        header, said, shown = capsys.readouterr().out.partition("not on this machine:\n")
        assert header.startswith("Recorded on ") and said, header
        assert not HERE.search(shown), f"{key}:\n{shown}"
        assert not NO_PROVENANCE.search(shown), f"{key}:\n{shown}"


def test_a_live_cells_here_is_relabelled_when_shown_from_a_record(monkeypatch, tmp_path, capsys):
    text = ("case                   measured here (ms)  H100, record 02/overlap (ms)\n"
            "---------------------  ------------------  ----------------------------\n"
            "copy 256 MiB (pinned)                4.86                          4.86\n"
            "here: copy at 55.2 GB/s; the limit is 100% of the overlapped time\n"
            "Here the stopwatch without a synchronize reported 14× too little.\n")
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"02/x": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
                                         "date": "2026-11-23", "text": text}}), encoding="utf-8")
    monkeypatch.setattr(recorded, "RECORDS", path)
    recorded.show_recorded("02/x")
    shown = [line.removeprefix("│ ") for line in capsys.readouterr().out.splitlines()[1:]]
    assert not HERE.search("\n".join(shown)), shown
    assert "recorded (ms)" in shown[0] and shown[3].startswith("recorded: copy at"), shown
    # the columns stay where the numbers are: each header starts where its column of dashes starts
    starts = [m.start() for m in re.finditer(r"-+", shown[1])]
    assert [m.start() for m in re.finditer(r"\S+(?: \S+)*", shown[0])] == starts, shown[:2]
    assert shown[2] == text.splitlines()[2] and "55.2 GB/s" in shown[3] and "14×" in shown[4]


def test_the_records_file_and_the_lessons_cite_no_issue_tracker():
    raw = (NOTEBOOKS / "recorded_on_gpu.json").read_text(encoding="utf-8")
    assert not NO_PROVENANCE.search(raw)
    for path in LESSONS:
        assert not NO_PROVENANCE.search(path.read_text(encoding="utf-8")), path.name


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_labels_of_recorded_figures_never_say_here(path):
    # A string literal that labels a recorded figure ("H100, recorded") must not also say it was measured here.
    notebook = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"\brecord", node.value) \
                    and HERE.search(node.value):
                found.append(f"cell {i}: {node.value!r}")
    assert found == []
