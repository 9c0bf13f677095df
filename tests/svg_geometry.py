"""Geometry of the SVG pictures MegaC writes (the ownership map, the loss curve), for tests.

Text boxes are measured as the writers lay them out: a fixed advance of 0.6 em per
character, the glyphs from 0.8 em above the baseline to 0.2 em below it; text-anchor start,
middle or end. rotate(...) text (an axis title) is measured as the rotated box."""
import re
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
EM = 0.6


def load(path):
    root = ET.parse(path).getroot()
    return root, float(root.get("width")), float(root.get("height"))


def font_of(el, root):
    return float(el.get("font-size") or root.get("font-size") or 12)


def text_boxes(root):
    """[(label, (x0, y0, x1, y1))] of every <text> with its own text."""
    out = []
    for el in root.iter(NS + "text"):
        label = "".join(el.itertext()).strip()
        if not label:
            continue
        font = font_of(el, root)
        x, y = float(el.get("x")), float(el.get("y"))
        w = EM * font * len(label)
        anchor = el.get("text-anchor", "start")
        x0 = x if anchor == "start" else x - w / 2 if anchor == "middle" else x - w
        box = (x0, y - 0.8 * font, x0 + w, y + 0.2 * font)
        m = re.match(r"rotate\(\s*-90\s+([-0-9.]+)\s+([-0-9.]+)\s*\)", el.get("transform", ""))
        if m:  # rotated a quarter turn anticlockwise about (cx, cy)
            cx, cy = float(m.group(1)), float(m.group(2))
            pts = [(cx + (py - cy), cy - (px - cx)) for px, py in ((box[0], box[1]), (box[2], box[3]))]
            box = (min(p[0] for p in pts), min(p[1] for p in pts), max(p[0] for p in pts), max(p[1] for p in pts))
        out.append((label, box))
    return out


def overlap(a, b, tol=0.01):
    return a[0] < b[2] - tol and b[0] < a[2] - tol and a[1] < b[3] - tol and b[1] < a[3] - tol


def inside(box, w, h, tol=0.01):
    return box[0] >= -tol and box[1] >= -tol and box[2] <= w + tol and box[3] <= h + tol


def check_labels(boxes, w, h, what):
    """Problems: labels outside the picture, pairs of labels that overlap."""
    problems = []
    for label, b in boxes:
        if not inside(b, w, h):
            problems.append("%s: label %r at %s leaves the %gx%g picture" % (what, label, fmt(b), w, h))
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if overlap(boxes[i][1], boxes[j][1]):
                problems.append("%s: labels %r %s and %r %s overlap" % (what, boxes[i][0], fmt(boxes[i][1]), boxes[j][0],
                                                                        fmt(boxes[j][1])))
    return problems


def fmt(b):
    return "[%.1f,%.1f..%.1f,%.1f]" % b
