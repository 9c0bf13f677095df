"""reshard.ownmap_svg: the ownership map's geometry (mcaudit --map, reshard/ownmap.c).

usage: test_ownmap_svg.py MCRESHARD MCAUDIT BENCH_RESHARD

A checkpoint of the default configuration's model (bench_reshard --synth --tiny) is rewritten
by mcreshard for several layouts, among them pipelines whose stages have one rank each, and
mcaudit --map draws each. Parsed as SVG (tests/svg_geometry.py measures text as the writer
lays it out):
  - no two labels overlap; every label lies inside the picture; no label covers a cell;
  - the rank columns fill the width right of the family names (the last column ends at the
    right margin) and start after the longest family name;
  - one stage header per stage, each inside its stage's columns; one cell per holder;
  - the .html form wraps the same SVG.
"""
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import svg_geometry as sg  # noqa: E402

MCRESHARD, MCAUDIT, BENCH = sys.argv[1:4]
LAYOUTS = {  # name: mcreshard layout options
    "pp2": ["--pp", "2"],
    "pp4": ["--pp", "4"],
    "tp2_pp2_dp2": ["--tp", "2", "--pp", "2", "--dp", "2", "--sp", "1"],
    "pp4_dp16": ["--pp", "4", "--dp", "16", "--zero", "1"],
    "ep2_dp2": ["--dp", "2", "--ep", "2"],
}
problems = []


def run(*cmd):
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit("FAIL: %s exited %d" % (" ".join(cmd), r.returncode))
    return r.stdout


def check_map(path, what, pp, world):
    root, w, h = sg.load(path)
    boxes = sg.text_boxes(root)
    problems.extend(sg.check_labels(boxes, w, h, what))
    cells = []
    for el in root.iter(sg.NS + "rect"):
        t = el.find(sg.NS + "title")
        if t is None:
            continue
        rank = int(re.match(r"rank (\d+) ", t.text).group(1))
        x, y, cw, ch = (float(el.get(k)) for k in ("x", "y", "width", "height"))
        cells.append((rank, (x, y, x + cw, y + ch)))
    if not cells:
        problems.append("%s: no cells" % what)
        return
    for label, b in boxes:
        for rank, c in cells:
            if sg.overlap(b, c):
                problems.append("%s: label %r %s covers the cell of rank %d %s" % (what, label, sg.fmt(b), rank, sg.fmt(c)))
                break
    ranks = {rank for rank, _ in cells}
    if ranks != set(range(world)):
        problems.append("%s: cells for ranks %s, want 0..%d" % (what, sorted(ranks), world - 1))
    right = max(c[2] for _, c in cells)
    left = min(c[0] for _, c in cells)
    if right < w - 25:
        problems.append("%s: the columns end at x=%.1f of a %g-wide picture (unused width)" % (what, right, w))
    names = [b for label, b in boxes if re.fullmatch(r"(embed|final_norm|head|layers)\.[\w.]+", label)]
    if not names or left < max(b[2] for b in names):
        problems.append("%s: the columns start at x=%.1f, inside the family names" % (what, left))
    stage_labels = [(label, b) for label, b in boxes if re.fullmatch(r"stage \d+|s\d+|\d+", label) and b[3] < min(c[1] for _, c in cells) - 10]
    if len(stage_labels) != pp:
        problems.append("%s: %d stage headers %s, want %d" % (what, len(stage_labels), [s for s, _ in stage_labels], pp))
    print("%s: %gx%g, %d labels, %d cells, columns %.1f..%.1f, stage headers %s" % (
        what, w, h, len(boxes), len(cells), left, right, [s for s, _ in stage_labels]))


with tempfile.TemporaryDirectory() as tmp:
    os.chdir(tmp)
    run(BENCH, "--synth", "src", "--tiny")
    for name, opts in LAYOUTS.items():
        run(MCRESHARD, "src", name, *opts, "--no-progress")
        doc = run(MCAUDIT, name, "--json", "--map", name + ".svg")
        import json
        lay = json.loads(doc)["layout"]
        world = lay["tp"] * lay["pp"] * lay["dp"]
        check_map(name + ".svg", name, lay["pp"], world)
    # HTML: the same SVG inside a page
    run(MCAUDIT, "pp2", "--map", "pp2.html")
    html = open("pp2.html").read()
    svg = html[html.index("<svg"):html.index("</svg>") + 6]
    if svg != open("pp2.svg").read().strip():
        problems.append("pp2.html does not hold the SVG of pp2.svg")
    ET.fromstring(svg)

for p in problems:
    print("FAIL:", p)
if problems:
    sys.exit(1)
print("reshard.ownmap_svg: ok")
