#!/usr/bin/env python3
"""Checks a run's metrics.csv and metrics.svg against its metrics.jsonl.

usage: metrics_check.py RUN_DIR

metrics.csv: the fixed header (train/metrics.h MC_METRICS_CSV_COLUMNS); one row per step
record and per checkpoint record of metrics.jsonl, in order (the memory report has none);
each cell reads back as the record's value exactly, empty where the record has none.

metrics.svg (the loss picture): one polyline each for train loss, validation loss (where
logged) and learning rate, with one point per record holding that value, the lr points on
the right-hand axis (0 at the bottom of the plot, the peak at 1/1.05 of its height); the
legend names all three; parsed as SVG, no two labels overlap and all lie inside the picture
(tests/svg_geometry.py)."""
import csv
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import svg_geometry as sg  # noqa: E402

COLUMNS = ["step", "time", "loss", "aux_loss", "val_loss", "lr", "grad_norm", "tokens", "tokens_per_s", "model_tflops",
           "mfu", "comm_s", "ckpt_paused_s", "ckpt_save_s"]
CKPT_KEYS = {"step": "checkpoint", "time": "time", "ckpt_paused_s": "paused_s", "ckpt_save_s": "save_s"}


def check_csv(run):
    recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    want = [r for r in recs if "step" in r or "checkpoint" in r]
    rows = list(csv.reader(open(os.path.join(run, "metrics.csv"), newline="")))
    header = re.search(r'#define MC_METRICS_CSV_COLUMNS \\\s*"([^"]+)"',
                       open(os.path.join(os.environ.get("MC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                                         "train/metrics.h")).read()).group(1).split(",")
    assert header == COLUMNS, f"train/metrics.h columns {header}, this test knows {COLUMNS}"
    assert rows[0] == COLUMNS, f"metrics.csv header {rows[0]}"
    assert len(rows) - 1 == len(want), f"metrics.csv has {len(rows) - 1} rows, metrics.jsonl {len(want)} step and checkpoint records"
    for row, r in zip(rows[1:], want):
        assert len(row) == len(COLUMNS), row
        for col, cell in zip(COLUMNS, row):
            key = CKPT_KEYS.get(col) if "checkpoint" in r else (None if col.startswith("ckpt_") else col)
            if key is None or key not in r:
                assert cell == "", f"{col} = {cell!r} in the row of {r}"
            else:
                assert float(cell) == float(r[key]), f"{col} = {cell!r}, metrics.jsonl {r[key]!r}"
    print(f"metrics.csv: {len(want)} rows equal metrics.jsonl")


def points(el):
    return [tuple(map(float, p.split(","))) for p in el.get("points").split()]


def check_svg(run):
    recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    root, w, h = sg.load(os.path.join(run, "metrics.svg"))
    boxes = sg.text_boxes(root)
    problems = sg.check_labels(boxes, w, h, "metrics.svg")
    assert not problems, "\n".join(problems)
    labels = [t for t, _ in boxes]
    lines = {el.get("stroke"): el for el in root.iter(sg.NS + "polyline")}
    want = {"#1f77b4": ("loss", "train loss"), "#d62728": ("val_loss", "validation loss"),
            "#2ca02c": ("lr", "learning rate (right axis)")}
    for color, (key, legend) in want.items():
        n = sum(1 for r in recs if "step" in r and key in r)
        assert n > 0, f"the run logged no {key}"
        assert color in lines, f"no {key} polyline"
        assert len(points(lines[color])) == n, f"{key}: {len(points(lines[color]))} points, {n} records"
        assert legend in labels, f"legend lacks {legend!r}: {labels}"
    # the lr axis: 0 at the plot's bottom, the peak lr at 1/1.05 of the plot's height
    axis = next(el for el in root.iter(sg.NS + "path"))
    m = re.match(r"M(\d+) (\d+) V(\d+) H(\d+) V(\d+)", axis.get("d"))
    top, bottom = float(m.group(2)), float(m.group(3))
    lrs = [r["lr"] for r in recs if "step" in r]
    for (x, y), lr in zip(points(lines["#2ca02c"]), lrs):
        want_y = bottom - lr / (max(lrs) * 1.05) * (bottom - top)
        assert abs(y - want_y) <= 0.06, f"lr {lr} drawn at y={y}, want {want_y:.2f}"
    print(f"metrics.svg: {len(boxes)} labels, none overlapping; train, validation and lr curves with their points")


if __name__ == "__main__":
    check_csv(sys.argv[1])
    check_svg(sys.argv[1])
