#!/usr/bin/env python3
"""Times MegaC's trainer (mctrain) on one reference configuration for the peer benchmark.

Runs `mctrain --config CONFIG --set train.dtype=DTYPE --until WARMUP+STEPS` with a metrics
line every step, reads the per-step tokens/s from metrics.jsonl (mctrain's own clock: the
whole step, data loading and the optimizer included) and writes one JSON record in the shape
bench/torch_hybrid.py writes, so `torch_hybrid.py --summarize` tabulates both side by side.
Device memory is the largest `nvidia-smi` reading of the process's used memory, sampled every
0.2 s (it includes the CUDA context, unlike torch.cuda.max_memory_allocated); 0 on the CPU.
The record also carries the trainer's step-1 memory report (metrics.jsonl's memory record:
bytes measured in each category's arena and mcplan's prediction) as `memory_report`.

Usage: megac_run.py --bin DIR --config configs/nam-small.json --dtype bf16 --data corpus.h5
                    --flops-per-token F --peak-tflops P --json-out FILE [--warmup 2 --steps 4]
                    [--device cuda|cpu] [--set section.key=value ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading

from bench_record import add_model_flops, result_line


def gpu_mem_sampler(pid, stop, peak):
    """Largest used memory (MiB) nvidia-smi reports for process pid until stop is set."""
    while not stop.is_set():
        try:
            out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5).stdout
            for line in out.splitlines():
                p, _, mib = line.partition(",")
                if p.strip() == str(pid):
                    peak[0] = max(peak[0], int(mib))
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
        stop.wait(0.2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="folder holding mctrain")
    ap.add_argument("--config", required=True)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), required=True)
    ap.add_argument("--data", required=True, help="token file from mcdata")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--flops-per-token", type=float, default=0.0)
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--json-out")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to mctrain's --set")
    args = ap.parse_args()

    total = args.warmup + args.steps
    name = os.path.basename(args.config).removesuffix(".json")
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [os.path.join(args.bin, "mctrain"), "--config", args.config, "--set", f"train.dtype={args.dtype}",
               "--set", f"train.device={args.device}", "--set", f"data.path={args.data}", "--set", f"checkpoint.dir={run_dir}",
               "--set", "checkpoint.every=0", "--set", "train.log_every=1", "--set", "train.eval_every=0",
               "--until", str(total)]
        for kv in args.set:
            cmd += ["--set", kv]
        print("$", " ".join(cmd), flush=True)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stop, peak = threading.Event(), [0]
        sampler = threading.Thread(target=gpu_mem_sampler, args=(proc.pid, stop, peak), daemon=True)
        if args.device == "cuda":
            sampler.start()
        for line in proc.stdout:
            print("  " + line.rstrip(), flush=True)
        rc = proc.wait()
        stop.set()
        if args.device == "cuda":
            sampler.join()
        if rc != 0:
            print(f"mctrain failed (exit {rc})", file=sys.stderr)
            return 1
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
    by_step = {r["step"]: r for r in recs if "step" in r and "tokens_per_s" in r}  # skip the memory record
    memory = next((r["memory"] for r in recs if "memory" in r), None)
    missing = [s for s in range(1, total + 1) if s not in by_step]
    if missing:
        print(f"metrics.jsonl lacks steps {missing}", file=sys.stderr)
        return 1
    tokens = by_step[1]["tokens"]  # cumulative, so step 1's count is the tokens of one step
    times = [tokens / by_step[s]["tokens_per_s"] for s in range(1, total + 1)]
    timed = times[args.warmup:]
    med = statistics.median(timed)
    res = {
        "config": name, "mode": "megac", "dtype": args.dtype, "tokens_per_step": tokens,
        "first_step_s": times[0], "step_s_median": med, "step_s_min": min(timed), "step_s_max": max(timed),
        "timed_steps": len(timed), "tokens_per_s": tokens / med,
        "loss_first": by_step[1]["loss"], "loss_last": by_step[total]["loss"],
        "max_mem_gib": peak[0] / 1024.0,
        "mem_source": "nvidia-smi used_memory (process, with CUDA context)" if args.device == "cuda" else "none (CPU)",
        "timed_step_range": [args.warmup + 1, total], "memory_report": memory,
    }
    add_model_flops(res, args.flops_per_token, args.peak_tflops)
    print(result_line(res), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
