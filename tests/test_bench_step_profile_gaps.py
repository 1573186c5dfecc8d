"""tools/bench/step_profile.kernel_summary: the GPU idle time between kernels (any stream) and the host op running in
the longest gaps, on hand-made profiler events (the real ones need CUDA)."""
from types import SimpleNamespace as NS

from torch.autograd import DeviceType

from tools.bench.step_profile import kernel_summary


def _ev(kind, name, start, end):
    return NS(device_type=kind, name=name, time_range=NS(start=start, end=end), device_time=end - start)


def test_idle_gaps_are_the_time_no_stream_runs_a_kernel_and_name_the_host_op():
    k, c = DeviceType.CUDA, DeviceType.CPU
    events = [_ev(k, "gemm_a", 0, 100), _ev(k, "copy_side_stream", 50, 160),  # overlap: busy 0-160
              _ev(k, "gemm_b", 200, 300),  # 40 us gap after 160
              _ev(k, "gemm_c", 310, 400),  # 10 us gap (under the 20 us threshold)
              _ev(k, "gemm_d", 1400, 1500),  # 1000 us gap
              _ev(c, "forward", 0, 2000), _ev(c, "aten::index", 900, 1000), _ev(c, "cudaDeviceSynchronize", 150, 190)]
    s = kernel_summary(events, wall_s=0.002)
    assert s["kernels"] == 5 and s["kernel_ms"] == (100 + 110 + 100 + 90 + 100) / 1e3
    assert s["span_ms"] == 1.5 and s["idle_ms"] == (40 + 10 + 1000) / 1e3
    assert s["gaps_over_min"] == dict(min_us=20.0, count=2, ms=1.04)
    assert [(g["us"], g["before"], g["after"], g["host"]) for g in s["top_gaps"]] == [
        (1000, "gemm_c", "gemm_d", "aten::index"), (40, "copy_side_stream", "gemm_b", "cudaDeviceSynchronize")]


def test_no_kernels_gives_the_totals_only():
    s = kernel_summary([_ev(DeviceType.CPU, "x", 0, 5)], wall_s=1.0)
    assert s == dict(kernels=0, kernel_ms=0.0, gemm_ms=0.0, busy_fraction=0.0)
