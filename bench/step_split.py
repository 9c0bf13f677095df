#!/usr/bin/env python3
"""Each rank's step split from MC_CUDA_PROFILE files of one run profiled on steps A..B
(MC_CUDA_PROFILE_STEPS=A:B, one file per process through '%p' in the path): GPU time in ops
per step, and the rest of the span per step, when the GPU ran no op of the backend: exposed
communication (NCCL kernels are not backend ops), the pipeline bubble and host waits, which
the profile cannot tell apart (under pp > 1 it is mostly the bubble). The profile's own
events add a few microseconds at every op boundary (docs/cuda.md), so the idle share is an
upper bound. Usage: step_split.py NAME PROFILE_FILE..."""
import re
import sys


def read(path):
    ops = span = rank = a = b = None
    for line in open(path):
        m = re.match(r'# profiled op time ([\d.]+) ms; span first-to-last op ([\d.]+) ms', line)
        if m:
            ops, span = float(m.group(1)), float(m.group(2))
        m = re.match(r'# ops of training steps (\d+) to (\d+) only', line)
        if m:
            a, b = int(m.group(1)), int(m.group(2))
        m = re.match(r'# process \d+, rank (\d+)', line)
        if m:
            rank = int(m.group(1))
    if ops is None or a is None:
        raise SystemExit(f"step_split.py: {path}: no profile header with MC_CUDA_PROFILE_STEPS (was the run profiled on a step range?)")
    return rank if rank is not None else -1, ops, span, b - a + 1


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    name, rows = sys.argv[1], sorted(read(p) for p in sys.argv[2:])
    for rank, ops, span, steps in rows:
        idle = max(span - ops, 0.0)
        print(f"{name:<28} rank {rank:>2}: {ops / steps:8.1f} ms in ops, {idle / steps:7.1f} ms idle "
              f"(communication, bubble, host) a step, {100 * idle / span if span > 0 else 0:5.1f}% of the span, "
              f"steps {steps}")
    worst = max(rows, key=lambda r: (r[2] - r[1]) / r[3])
    print(f"{name:<28} most idle: rank {worst[0]}, {(worst[2] - worst[1]) / worst[3]:.1f} ms a step")


if __name__ == "__main__":
    main()
