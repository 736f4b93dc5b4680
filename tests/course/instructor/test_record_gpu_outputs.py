"""Recorded GPU outputs: taken only from cells that really ran on a GPU, shown only labelled as recorded."""

from __future__ import annotations

import json

import nbformat
import pytest

from course_lib import devices, recorded
from course_lib.instructor import record_gpu_outputs


def _executed(tmp_path, outputs):
    cell = nbformat.v4.new_code_cell('if require_gpus(1, "time a copy", record="01/copy"):\n    print(1)')
    cell.outputs = outputs
    path = tmp_path / "01_executed.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    return path


def _stream(text, name="stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


@pytest.fixture
def records(tmp_path, monkeypatch):
    path = tmp_path / "recorded_on_gpu.json"
    monkeypatch.setattr(recorded, "RECORDS", path)
    monkeypatch.setattr(record_gpu_outputs, "RECORDS", path)
    return path


def test_a_gpu_run_is_recorded_with_its_device_torch_and_date(tmp_path, records):
    notebook = _executed(tmp_path, [_stream("the same on the CPU: 5 ms\n"),  # a CPU part before the GPU one
                                    _stream("measured on NVIDIA H100 80GB HBM3 · torch 2.11.0+cu130 · 2026-11-20\n"
                                            "pinned 53.6 GB/s\n")])
    assert record_gpu_outputs.main([str(notebook)]) == 0
    saved = json.loads(records.read_text())["01/copy"]
    assert saved == {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "date": "2026-11-20",
                     "text": "pinned 53.6 GB/s\n", "notebook": "01_executed.ipynb"}


@pytest.mark.parametrize("outputs", [
    [_stream("This cell needs 1 CUDA GPU to time a copy; this machine has 0. Skipping it\n")],  # ran on a CPU
    [_stream("measured on NVIDIA H100 · torch 2.11.0 · 2026-11-20\n"), _stream("Traceback", "stderr")],  # failed
])
def test_a_skipped_or_failed_cell_is_not_recorded(tmp_path, records, outputs, capsys):
    record_gpu_outputs.main([str(_executed(tmp_path, outputs))])
    assert json.loads(records.read_text()) == {}
    assert "not recorded: 01/copy" in capsys.readouterr().out


def test_without_a_gpu_the_cell_shows_the_record_labelled_as_recorded(records, monkeypatch, capsys):
    records.write_text(json.dumps({"01/copy": {"device": "NVIDIA H100", "torch": "2.11.0", "date": "2026-11-20",
                                               "text": "pinned 53.6 GB/s\n"}}))
    monkeypatch.setattr(devices, "cuda_gpu_count", lambda: 0)
    assert devices.require_gpus(1, "time a copy", record="01/copy") is False
    out = capsys.readouterr().out
    assert "Skipped: this cell needs 1 CUDA GPU and this machine has 0." in out
    assert "Recorded on NVIDIA H100 with torch 2.11.0 on 2026-11-20, not on this machine" in out
    assert "│ pinned 53.6 GB/s" in out
    devices.require_gpus(1, "time a copy", record="01/never-run")
    assert "No GPU run of this cell has been recorded yet" in capsys.readouterr().out


def test_the_committed_records_are_well_formed():
    records = recorded.load_records()
    for key, record in records.items():
        assert {"device", "torch", "date", "text"} <= set(record), key
        assert key.split("/")[0].isdigit(), f"{key}: keys are NN/name, NN the notebook's number"


def test_a_long_recorded_line_is_folded_at_spaces_to_fit_the_page(records, capsys):
    words = [f"word{i:02d}" for i in range(30)]  # 209 characters on one line, as a GPU cell may have printed it
    records.write_text(json.dumps({"02/long": {"device": "NVIDIA H100", "torch": "2.11.0", "date": "2026-11-23",
                                               "text": "short line\n" + " ".join(words) + "\n"}}))
    assert recorded.show_recorded("02/long")
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= recorded.WIDTH for line in lines), lines
    assert "│ short line" in lines
    shown = " ".join(line.removeprefix("│ ").strip() for line in lines if line.startswith("│ ") and "word" in line)
    assert shown.split() == words  # every word whole, in order
