"""CUDA-event timing of a PyTorch callable, shared by the kernel benchmarks' baselines."""
import statistics


def median_us(torch, fn, warmup, iters):
    """Median wall time of fn() on the current stream in µs, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)
