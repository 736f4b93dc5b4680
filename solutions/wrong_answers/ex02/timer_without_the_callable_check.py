"""time_device leaves out its check of fn: time_device(3, "cpu") raises Python's own "not callable" TypeError."""

LOSES = ["test_time_device_rejects_bad_arguments"]


def time_device(fn, device, *, warmup=3, repeat=10):
    if warmup < 0 or repeat < 1:
        raise ValueError(f"need warmup >= 0 and repeat >= 1, got warmup={warmup}, repeat={repeat}")
    kind = torch.device(device).type
    for _ in range(warmup):  # the first calls pay for allocation, kernel selection, caches
        fn()
    if kind == "cuda":
        with torch.cuda.device(device):  # record() and synchronize() below concern `device`, not the current one
            pairs = []
            for _ in range(repeat):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()  # on `device`'s current stream, in order with fn's work
                fn()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize(device)  # an event can only be read once the GPU has passed it
            return [start.elapsed_time(end) / 1e3 for start, end in pairs]  # elapsed_time is in milliseconds
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times
