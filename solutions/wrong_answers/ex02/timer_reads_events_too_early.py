"""time_device reads elapsed_time right after recording, before the GPU has reached the events (no synchronize)."""

LOSES = ["test_time_device_times_queued_gpu_work_on_a_simulated_gpu"]


def time_device(fn, device, *, warmup=3, repeat=10):
    if not callable(fn):
        raise TypeError("fn must be callable")
    if warmup < 0 or repeat < 1:
        raise ValueError("need warmup >= 0 and repeat >= 1")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if torch.device(device).type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times
