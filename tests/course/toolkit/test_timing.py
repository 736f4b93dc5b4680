"""benchmark and compare on the CPU: which clock, which devices are waited for, and a missing device refused."""

from __future__ import annotations

import pytest
import torch

from course_lib import timing
from course_lib.timing import benchmark, compare


def _counting():
    calls = []
    return calls, lambda: calls.append(1)


def test_no_device_without_an_accelerator_times_the_cpu(monkeypatch):
    monkeypatch.setattr(timing, "_accelerator_available", lambda: False)
    calls, fn = _counting()
    result = benchmark(fn, warmup=2, repeat=5)
    assert len(calls) == 7 and len(result.times) == 5 and result.device == "cpu"
    assert all(t >= 0 for t in result.times)


def test_no_device_with_an_accelerator_is_refused_before_any_run(monkeypatch):
    # On a GPU machine fn may queue kernels that a stopwatch would not wait for: it must not guess the CPU.
    monkeypatch.setattr(timing, "_accelerator_available", lambda: True)
    calls, fn = _counting()
    with pytest.raises(ValueError, match=r"device='cpu'"):
        benchmark(fn)
    with pytest.raises(ValueError, match=r"no device"):
        compare({"a": fn}, show=False)
    assert calls == []


def test_an_explicit_cpu_is_timed_even_where_an_accelerator_is(monkeypatch):
    monkeypatch.setattr(timing, "_accelerator_available", lambda: True)
    calls, fn = _counting()
    assert benchmark(fn, device="cpu", warmup=0, repeat=3).device == "cpu"
    assert compare({"a": fn, "b": fn}, device=torch.device("cpu"), warmup=0, repeat=2, show=False).keys() == {"a", "b"}
    assert len(calls) == 3 + 4


def test_another_accelerator_is_synchronised_around_every_run(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: waited.append(str(device)))
    calls, fn = _counting()
    result = benchmark(fn, device="xpu:1", warmup=1, repeat=4)
    assert len(calls) == 5 and len(result.times) == 4 and result.device == "xpu"
    assert waited == ["xpu:1"] * 8  # before and after each timed run, on the device given, not the current one


def test_a_list_of_devices_synchronises_each_of_them(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: waited.append(str(device)))
    result = benchmark(lambda: None, device=["xpu:0", "xpu:1", "cpu", "meta"], warmup=0, repeat=2)
    assert result.device == "xpu:0, xpu:1, meta"
    assert waited == ["xpu:0", "xpu:1"] * 4


@pytest.mark.parametrize("kwargs", [{"warmup": -1}, {"repeat": 0}, {"device": []}])
def test_bad_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        benchmark(lambda: None, **{"device": "cpu", **kwargs})


def test_not_callable_raises_type_error():
    with pytest.raises(TypeError):
        benchmark(42, device="cpu")
