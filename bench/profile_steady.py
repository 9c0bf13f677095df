#!/usr/bin/env python3
"""Steady-state GPU time per op from two MC_CUDA_PROFILE files of the same configuration:
a run of A steps and a run of B > A steps (op time of steps A+1..B = the difference), per
micro-batch. Usage: profile_steady.py PROF_A PROF_B MICRO_BATCHES_BETWEEN"""
import re
import sys


def load(path):
    ops = {}
    for line in open(path):
        m = re.match(r'\s*([\d.]+)\s+[\d.]+%\s+(\d+)\s+[\d.\s]*\s([a-z_0-9]+)\s*$', line)
        if m:
            ops[m.group(3)] = (float(m.group(1)), int(m.group(2)))
    return ops


def main():
    a, b, micro = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
    rows = []
    for op, (ms, calls) in b.items():
        if op in ('to_host', 'from_host'):  # host waits, not GPU work of the step
            continue
        ms0, calls0 = a.get(op, (0.0, 0))
        rows.append((ms - ms0, calls - calls0, op))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print("steady state: %.2f ms of op time per micro-batch (%d micro-batches)" % (total / micro, micro))
    print("%10s %6s %8s %9s  %s" % ("ms/micro", "%", "calls", "us/call", "op"))
    for ms, calls, op in rows:
        print("%10.3f %5.1f%% %8.1f %9.1f  %s" % (ms / micro, 100 * ms / total, calls / micro,
                                                 1000 * ms / calls if calls else 0.0, op))


if __name__ == "__main__":
    main()
