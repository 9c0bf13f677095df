#!/usr/bin/env python3
"""Reads a run's TensorBoard event file with its own decoder (TFRecord framing with masked
CRC-32C, Event/Summary/Value protocol buffers) and checks it against metrics.jsonl: the first
event is file_version brain.Event:2, every logged step's train/loss, train/lr,
train/grad_norm (and val/loss where logged) equal the metrics record's values as float32, and
the checkpoint pauses appear at checkpoint steps. Where TensorBoard is installed, its own
reader (EventAccumulator) must see the same scalars.
Usage: tfevents_check.py RUN_DIR CHECKPOINT_EVERY"""
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


def main():
    run, every = sys.argv[1], int(sys.argv[2])
    files = sorted(glob.glob(f"{run}/tensorboard/events.out.tfevents.*"))
    assert files, f"no event file in {run}/tensorboard"
    evs = [e for f in files for e in events(f)]
    assert evs[0].get("file_version") == "brain.Event:2", evs[0]
    seen = {}
    for e in evs[1:]:
        for tag, x in e["scalars"].items():
            seen[(tag, e.get("step", 0))] = x
    recs = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step"' in l]
    n = 0
    for r in recs:
        for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                         ("train/aux_loss", "aux_loss"), ("val/loss", "val_loss")):
            if key in r:
                got = seen.get((tag, r["step"]))
                assert got == f32(r[key]), f"step {r['step']} {tag}: {got} in the events, {r[key]} in metrics.jsonl"
                n += 1
    pauses = sorted(s for (t, s) in seen if t == "checkpoint/training_paused_s")
    want = [r["step"] for r in recs if every > 0 and r["step"] % every == 0 and r["step"] != recs[-1]["step"]]
    assert pauses == want, f"checkpoint pauses at steps {pauses}, checkpoints at {want}"
    print(f"tfevents: {len(evs)} events, {n} scalars equal metrics.jsonl, checkpoint pauses at steps {pauses}")
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        print("tensorboard not installed: its reader not run")
        return
    acc = EventAccumulator(f"{run}/tensorboard")
    acc.Reload()
    for r in recs:
        got = [s.value for s in acc.Scalars("train/loss") if s.step == r["step"]]
        assert got and got[-1] == f32(r["loss"]), f"TensorBoard's reader: step {r['step']} train/loss {got}"
    print(f"TensorBoard's EventAccumulator reads the same train/loss at {len(recs)} steps; tags {sorted(acc.Tags()['scalars'])}")


if __name__ == "__main__":
    main()
