#!/usr/bin/env python3
"""Where a training step's GPU time goes, by model part, MegaC beside its PyTorch peer.

MegaC: an MC_CUDA_PROFILE file of N steady steps (MC_CUDA_PROFILE_STEPS=A:B with N = B-A+1,
so the first step's set-up is left out); its "scope" lines hold the GPU time of the ops
queued while the network was in a part (kernels/cuda/cuda_profile.cu: events around every
op, so host gaps between ops are not counted). Peer: bench/torch_hybrid.py --block-times
--json-out (CUDA events at part boundaries of one step, host gaps inside a part counted).
Rows are ms per optimizer step: embedding, each block kind (all its layers), head and loss,
gradient zeroing, optimizer (MegaC: gradient sync, norm and update; peer: clip and fused
AdamW).

Usage: block_table.py --megac PROF N --peer PEER.json [--megac-json RUN.json]
"""
import argparse
import json
import sys

PARTS = ["embed", "A", "M", "E", "R", "head", "zero grads", "optimizer", "(none)"]


def scopes(path):
    """label -> ms of a profile file's scope lines."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("scope "):
                head = line.split("|")[0].split()
                out[" ".join(head[4:])] = float(head[1])
    if not out:
        raise SystemExit(f"{path}: no 'scope' lines (a profile of an mctrain built before the part table?)")
    return out


def split(label):
    """('A', 'fwd') of 'A fwd'; ('optimizer', 'fwd') of a label without a pass."""
    part, _, pas = label.rpartition(" ")
    return (part, pas) if pas in ("fwd", "bwd") else (label, "fwd")


def rows_of(per_step):
    rows = {}
    for label, ms in per_step.items():
        part, pas = split(label)
        rows.setdefault(part, {"fwd": 0.0, "bwd": 0.0})[pas] += ms
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--megac", nargs=2, metavar=("PROF", "N"), required=True,
                    help="MC_CUDA_PROFILE file of N profiled steps (MC_CUDA_PROFILE_STEPS)")
    ap.add_argument("--peer", required=True, help="torch_hybrid.py --block-times --json-out file")
    ap.add_argument("--megac-json", help="megac_run.py record of the unprofiled run (its step time)")
    a = ap.parse_args()
    n_steps = int(a.megac[1])
    if n_steps < 1:
        raise SystemExit("block_table.py: N must be at least 1")
    mega = {k: v / n_steps for k, v in scopes(a.megac[0]).items()}
    with open(a.peer) as f:
        peer_rec = json.load(f)
    if "blocks" not in peer_rec:
        raise SystemExit(f"{a.peer}: no 'blocks' (run torch_hybrid.py with --block-times)")
    peer = peer_rec["blocks"]["per_step_ms"]
    mr, pr = rows_of(mega), rows_of(peer)
    print(f"ms per optimizer step; MegaC: profile of {n_steps} steps, per step; "
          f"peer: {peer_rec['mode']} {peer_rec['dtype']}, one marked step, {peer_rec['micro_batch']} x "
          f"{peer_rec['seq_len']} tokens per micro-batch")
    print("| part | MegaC fwd | MegaC bwd | MegaC total | peer fwd | peer bwd | peer total | MegaC / peer |")
    print("|---|---|---|---|---|---|---|---|")
    tm = tp = 0.0
    for part in PARTS + sorted((set(mr) | set(pr)) - set(PARTS)):
        if part not in mr and part not in pr:
            continue
        m = mr.get(part, {"fwd": 0.0, "bwd": 0.0})
        p = pr.get(part, {"fwd": 0.0, "bwd": 0.0})
        mt, pt = m["fwd"] + m["bwd"], p["fwd"] + p["bwd"]
        tm, tp = tm + mt, tp + pt
        ratio = f"{mt / pt:.2f}" if pt > 0 else "-"
        print(f"| {part} | {m['fwd']:.1f} | {m['bwd']:.1f} | {mt:.1f} | {p['fwd']:.1f} | {p['bwd']:.1f} | {pt:.1f} | {ratio} |")
    print(f"| total | | | {tm:.1f} | | | {tp:.1f} | {tm / tp:.2f} |")
    step_p = peer_rec["step_s_median"] * 1e3
    line = f"peer step (median, unmarked) {step_p:.1f} ms"
    if a.megac_json:
        with open(a.megac_json) as f:
            line = f"MegaC step (median, unprofiled) {json.load(f)['step_s_median'] * 1e3:.1f} ms; " + line
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
