"""time_device synchronises after fn() but not before starting the clock: the warm-up's queued work lands in the first timing."""

LOSES = ["test_time_device_times_queued_gpu_work_on_a_simulated_gpu"]


def time_device(fn, device, *, warmup=3, repeat=10):
    if not callable(fn):
        raise TypeError("fn must be callable")
    if warmup < 0 or repeat < 1:
        raise ValueError("need warmup >= 0 and repeat >= 1")
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times
