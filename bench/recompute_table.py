#!/usr/bin/env python3
"""The table of bench/recompute.sh: one row per recompute policy from its run record
(bench/megac_run.py --json-out, run_<policy>.json) and mcplan's plan (mcplan --json,
mcplan_<policy>.json) in one folder.

Usage: recompute_table.py DIR POLICY...

Columns: tokens/s, the median over the timed steps (the record's timed_step_range) of mctrain's
per-step figure; the activations arena the trainer measured after step 1 (its memory report)
and mcplan's activations for rank 0 with their ratio; mcplan's recomputed forward and hardware
FLOPs per token; the peak device memory nvidia-smi saw for the process ('-' on the CPU: the
trainer itself reports no peak)."""
import json
import os
import sys


def main():
    folder, policies = sys.argv[1], sys.argv[2:]
    head = ("policy", "tokens/s", "step ms", "act. arena MiB", "mcplan act. MiB", "arena/plan", "recomp FLOP/tok",
            "hw FLOP/tok", "peak dev GiB")
    rows, steps = [], None
    for pol in policies:
        with open(os.path.join(folder, f"run_{pol}.json")) as f:
            run = json.load(f)
        with open(os.path.join(folder, f"mcplan_{pol}.json")) as f:
            plan = json.load(f)
        steps = run["timed_step_range"]
        planned = plan["memory"]["ranks"][0]["bytes"]["activations"]
        rep = run.get("memory_report") or {}
        measured = rep.get("categories", {}).get("activations", {}).get("measured")
        rows.append((pol, f"{run['tokens_per_s']:.0f}", f"{run['step_s_median'] * 1e3:.1f}",
                     "-" if measured is None else f"{measured / 2**20:.2f}", f"{planned / 2**20:.2f}",
                     "-" if measured is None or not planned else f"{measured / planned:.4f}",
                     f"{plan['flops']['recompute_per_token']:.4g}", f"{plan['flops']['hardware_per_token']:.4g}",
                     f"{run['max_mem_gib']:.2f}" if run["mem_source"].startswith("nvidia-smi") else "-"))
    print(f"tokens/s: median of steps {steps[0]}-{steps[1]} (mctrain's per-step tokens/s, whole step); "
          "activations: bytes after step 1, rank 0")
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).rjust(w[i]) for i, c in enumerate(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
