"""Eager-mode host overhead and host<->device copy throughput of the spyre device.

    python benchmarks/eager.py [--repeat N] [--quick]

Prints medians and ratios measured in the same run:
- host wall time of a small eager op (add, matmul, relu on small tensors) on the CPU and on spyre, both
  as a cached single-op program (the default, ``TORCH_SPYRE_EAGER=compile``; the first call, which
  compiles, is a warm-up) and through the host fallback (``TORCH_SPYRE_EAGER=host``);
- host wall time and throughput of host->device and device->host copies (fp32 and fp16, the latter with
  DLFloat16 conversion), next to the simulated PCIe time the card's clock takes for the same copy.
Host time is this machine's; simulated time is the card model's (docs/device.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch

import torch_spyre  # noqa: F401
from torch_spyre.runtime import stream as rt


def median_seconds(fn, repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


@contextlib.contextmanager
def eager_mode(mode: str):
    previous = os.environ.get("TORCH_SPYRE_EAGER")
    os.environ["TORCH_SPYRE_EAGER"] = mode
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCH_SPYRE_EAGER", None)
        else:
            os.environ["TORCH_SPYRE_EAGER"] = previous


def small_ops(repeat: int) -> list[tuple[str, float, float, float]]:
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    da, db = a.to("spyre"), b.to("spyre")
    x, dx = torch.randn(1, 1024), torch.randn(1, 1024).to("spyre")
    rows = []
    for name, cpu_fn, spyre_fn in [
        ("add 64x64 fp32", lambda: a + b, lambda: da + db),
        ("matmul 64x64 fp32", lambda: a @ b, lambda: da @ db),
        ("relu 1x1024 fp32", lambda: torch.relu(x), lambda: torch.relu(dx)),
        ("view+select (metadata only)", lambda: a.t()[3], lambda: da.t()[3]),
    ]:
        with eager_mode("compile"):
            program = median_seconds(spyre_fn, repeat)
        with eager_mode("host"):
            host = median_seconds(spyre_fn, repeat)
        rows.append((name, median_seconds(cpu_fn, repeat), program, host))
    return rows


def copies(repeat: int, nbytes: int) -> list[tuple[str, float, float, float]]:
    rows = []
    for dtype in (torch.float32, torch.float16):
        n = nbytes // torch.empty(0, dtype=dtype).element_size()
        host = torch.randn(n // 1024, 1024).to(dtype)
        dev = host.to("spyre")
        for direction, fn in (("h2d", lambda: host.to("spyre")), ("d2h", lambda: dev.cpu())):
            wall = median_seconds(fn, repeat, warmup=1)
            got: list[rt.WorkRecord] = []
            rt.add_listener(got.append)
            fn()
            rt.remove_listener(got.append)
            simulated = next(r.duration for r in got if r.kind == f"copy_{direction}")
            rows.append((f"{direction} {str(dtype).replace('torch.', '')} {nbytes >> 20} MiB", wall, nbytes / wall, simulated))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200, help="timed repetitions per small op (default 200)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and a smaller copy")
    args = parser.parse_args()
    repeat = 30 if args.quick else args.repeat
    copy_bytes = (4 if args.quick else 32) << 20

    torch.set_num_threads(1)  # the spyre fallback and the CPU reference both run on one host thread
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("\nHost overhead of small eager ops (median wall time per call)")
    print(f"{'op':32} {'cpu us':>10} {'program us':>11} {'prog/cpu':>9} {'host-path us':>13} {'host/cpu':>9}")
    for name, cpu, program, host in small_ops(repeat):
        print(f"{name:32} {cpu * 1e6:10.1f} {program * 1e6:11.1f} {program / cpu:9.1f} {host * 1e6:13.1f} "
              f"{host / cpu:9.1f}")

    print("\nHost<->device copies (median host wall time; simulated = time on the card's PCIe model)")
    print(f"{'copy':24} {'host ms':>9} {'host GB/s':>10} {'simulated ms':>13} {'host/simulated':>15}")
    for name, wall, bps, simulated in copies(max(3, repeat // 20), copy_bytes):
        print(f"{name:24} {wall * 1e3:9.2f} {bps / 1e9:10.2f} {simulated * 1e3:13.3f} {wall / simulated:15.1f}")


if __name__ == "__main__":
    main()
