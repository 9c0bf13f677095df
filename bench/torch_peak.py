#!/usr/bin/env python3
"""Dense matrix-product peak of this card through PyTorch (cuBLAS): the denominator of MFU.

M = N = K = 8192 (default), random normal inputs (never zeros), three input sets rotated so
repeated products do not reuse one set; each product timed alone with CUDA events after
warm-up; the median is reported. fp32 is IEEE fp32 (TF32 off), as in the fp32 benchmark runs;
tf32 is printed for reference only.
Usage: torch_peak.py [--size 8192] [--reps 20] [--json-out FILE]
"""
import argparse
import json
import statistics
import sys

import torch


def measure(dtype, tf32, size, reps):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    g = torch.Generator(device="cuda").manual_seed(3)
    sets = [(torch.randn(size, size, generator=g, device="cuda").to(dtype),
             torch.randn(size, size, generator=g, device="cuda").to(dtype)) for _ in range(3)]
    out = torch.empty(size, size, device="cuda", dtype=dtype)
    for i in range(3):
        torch.mm(*sets[i % 3], out=out)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        a, b = sets[i % 3]
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.mm(a, b, out=out)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    if not torch.isfinite(out).all():
        raise SystemExit(f"non-finite product for {dtype}")
    med = statistics.median(times)
    return {"tflops": 2.0 * size**3 / med / 1e12, "median_ms": med * 1e3, "min_ms": min(times) * 1e3,
            "max_ms": max(times) * 1e3, "reps": reps}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_peak.py: no CUDA device")
    res = {"card": torch.cuda.get_device_name(), "torch": torch.__version__, "size": args.size}
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("fp32", torch.float32, False),
                              ("tf32", torch.float32, True)):
        res[name] = measure(dtype, tf32, args.size, args.reps)
        r = res[name]
        print(f"PEAK {name}: {r['tflops']:.1f} TFLOP/s ({args.size}^3 product, median of {r['reps']}: "
              f"{r['median_ms']:.3f} ms, min {r['min_ms']:.3f}, max {r['max_ms']:.3f})", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
