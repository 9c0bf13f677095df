#!/usr/bin/env python3
"""Reads a run's TensorBoard event file with its own decoder (TFRecord framing with masked
CRC-32C, Event/Summary/Value protocol buffers) and checks it against metrics.jsonl: the first
event is file_version brain.Event:2, every logged step's train/loss, train/lr,
train/grad_norm (and val/loss where logged) equal the metrics record's values as float32, and
every checkpoint (periodic and last) has checkpoint/training_paused_s and checkpoint/save_s
equal to its metrics.jsonl record, train/tokens_per_s, train/model_tflops, train/mfu (with
--peak-tflops) and train/comm_s equal the records within their printed rounding, and the
step-1 memory report's measured bytes are memory/<category> and memory/total at step 1.
Where TensorBoard is installed, its own reader (EventAccumulator) must see the same scalars.
Usage: tfevents_check.py RUN_DIR CHECKPOINT_EVERY [PEAK_TFLOPS]"""
import glob
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        (n,) = struct.unpack_from("<Q", data, at)
        (hc,) = struct.unpack_from("<I", data, at + 8)
        assert hc == masked(crc32c(data[at:at + 8])), f"length CRC at byte {at}"
        rec = data[at + 12:at + 12 + n]
        (dc,) = struct.unpack_from("<I", data, at + 12 + n)
        assert dc == masked(crc32c(rec)), f"data CRC at byte {at}"
        yield rec
        at += 12 + n + 4


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if not c & 0x80:
            return v, i


def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 1:
            v = b[i:i + 8]
            i += 8
        elif wt == 5:
            v = b[i:i + 4]
            i += 4
        elif wt == 2:
            n, i = varint(b, i)
            v = b[i:i + n]
            i += n
        else:
            raise AssertionError(f"wire type {wt}")
        yield num, v


def events(path):
    for rec in records(path):
        ev = {"scalars": {}}
        for num, v in fields(rec):
            if num == 1:
                ev["wall_time"] = struct.unpack("<d", v)[0]
            elif num == 2:
                ev["step"] = v
            elif num == 3:
                ev["file_version"] = v.decode()
            elif num == 5:
                for n2, val in fields(v):
                    assert n2 == 1
                    tag = x = None
                    for n3, w in fields(val):
                        if n3 == 1:
                            tag = w.decode()
                        elif n3 == 2:
                            x = struct.unpack("<f", w)[0]
                    ev["scalars"][tag] = x
        yield ev


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


# metrics.jsonl prints these rounded (tokens_per_s %.1f, seconds %.6f, model_tflops and mfu
# %.6g); the others with 17 digits, so they must equal the event's float32 exactly.
ROUNDED = {"tokens_per_s": (0.05, 1e-6), "comm_s": (1e-6, 1e-6), "paused_s": (1e-6, 1e-6), "save_s": (1e-6, 1e-6),
           "model_tflops": (0.0, 1e-5), "mfu": (0.0, 1e-5)}


def close(got, want, key):
    if got is None:
        return False
    if key not in ROUNDED:
        return got == f32(want)
    a, r = ROUNDED[key]
    return abs(got - want) <= a + r * abs(want) + 1e-7 * abs(want)


def main():
    run, every = sys.argv[1], int(sys.argv[2])
    peak = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0  # mctrain --peak-tflops
    files = sorted(glob.glob(f"{run}/tensorboard/events.out.tfevents.*"))
    assert files, f"no event file in {run}/tensorboard"
    evs = [e for f in files for e in events(f)]
    assert evs[0].get("file_version") == "brain.Event:2", evs[0]
    seen = {}
    for e in evs[1:]:
        for tag, x in e["scalars"].items():
            seen[(tag, e.get("step", 0))] = x
    lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
    recs = [r for r in lines if "step" in r]
    ckpts = [r for r in lines if "checkpoint" in r]
    mem = [r["memory"] for r in lines if "memory" in r]
    n = 0
    for r in recs:
        for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                         ("train/aux_loss", "aux_loss"), ("val/loss", "val_loss"), ("train/tokens_per_s", "tokens_per_s"),
                         ("train/model_tflops", "model_tflops"), ("train/mfu", "mfu"), ("train/comm_s", "comm_s")):
            if key in r:
                got = seen.get((tag, r["step"]))
                assert close(got, r[key], key), f"step {r['step']} {tag}: {got} in the events, {r[key]} in metrics.jsonl"
                n += 1
        assert "model_tflops" in r, f"step {r['step']}: no model_tflops"
        assert ("mfu" in r) == (peak > 0), f"step {r['step']}: mfu {'missing' if peak else 'without --peak-tflops'}"
        if peak:
            assert abs(r["mfu"] - r["model_tflops"] / peak) <= 1e-5 * r["mfu"] + 1e-12, r
    # every checkpoint (the periodic ones and the last) once, in metrics.jsonl and in the events
    want = [r["step"] for r in recs if every > 0 and r["step"] % every == 0] + [recs[-1]["step"]]
    want = sorted(set(want))
    assert sorted(c["checkpoint"] for c in ckpts) == want, f"checkpoint records {[c['checkpoint'] for c in ckpts]}, want {want}"
    for c in ckpts:
        for tag, key in (("checkpoint/training_paused_s", "paused_s"), ("checkpoint/save_s", "save_s")):
            got = seen.get((tag, c["checkpoint"]))
            assert close(got, c[key], key) and c[key] >= 0, f"checkpoint {c['checkpoint']} {tag}: {got}, metrics.jsonl {c[key]}"
            n += 1
    pauses = sorted(s for (t, s) in seen if t == "checkpoint/training_paused_s")
    assert pauses == want, f"checkpoint pauses at steps {pauses}, checkpoints at {want}"
    # the step-1 memory report's measured bytes, each category and the total
    if mem:
        total = 0
        for cat, v in mem[0]["categories"].items():
            if v["measured"] is not None:
                assert seen.get((f"memory/{cat}", 1)) == f32(v["measured"]), f"memory/{cat}: {seen.get((f'memory/{cat}', 1))} vs {v}"
                total += v["measured"]
                n += 1
            else:
                assert (f"memory/{cat}", 1) not in seen, f"memory/{cat} written without a measurement"
        assert seen.get(("memory/total", 1)) == f32(total), f"memory/total {seen.get(('memory/total', 1))} vs {total}"
    print(f"tfevents: {len(evs)} events, {n} scalars equal metrics.jsonl, checkpoints at steps {pauses}, memory report {bool(mem)}")
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        print("tensorboard not installed: its reader not run")
        return
    acc = EventAccumulator(f"{run}/tensorboard", size_guidance={"scalars": 0})
    acc.Reload()
    for r in recs:
        got = [s.value for s in acc.Scalars("train/loss") if s.step == r["step"]]
        assert got and got[-1] == f32(r["loss"]), f"TensorBoard's reader: step {r['step']} train/loss {got}"
    # every scalar this decoder read, TensorBoard's reader reads alike
    tags = set(acc.Tags()["scalars"])
    assert tags == {t for t, _ in seen}, f"TensorBoard's reader sees tags {sorted(tags)}, this decoder {sorted({t for t, _ in seen})}"
    for (tag, step), x in seen.items():
        got = [s.value for s in acc.Scalars(tag) if s.step == step]
        assert got and got[-1] == x, f"TensorBoard's reader: {tag} at step {step} {got}, this decoder {x}"
    print(f"TensorBoard's EventAccumulator reads the same {len(seen)} scalars ({len(tags)} tags: {sorted(tags)})")


if __name__ == "__main__":
    main()
