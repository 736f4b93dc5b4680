"""time_device records its events and synchronises on the current device: work queued on another device ("cuda:1" while cuda:0 is current) is never timed."""

LOSES = ["test_time_device_times_the_device_it_is_given_on_its_current_stream"]


def time_device(fn, device, *, warmup=3, repeat=10):
    if not callable(fn):
        raise TypeError("fn must be callable")
    if warmup < 0 or repeat < 1:
        raise ValueError("need warmup >= 0 and repeat >= 1")
    for _ in range(warmup):
        fn()
    if torch.device(device).type == "cuda":
        pairs = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()  # the current stream of the *current* device
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in pairs]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times
