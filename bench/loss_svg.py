"""Loss curves of several mctrain runs as one SVG (no plotting library needed).

    python3 bench/loss_svg.py OUT.svg "LABEL=run/metrics.jsonl" ...

Reads each metrics.jsonl (records with "step" and "loss"; evaluation records with
"val_loss"), draws the training loss (solid) and validation loss (dots) of every run on shared
axes, and prints a table: final training loss (mean of the last 5 logged), best validation
loss, per run."""
import json
import sys


def read(path):
    train, val = [], []
    for line in open(path):
        r = json.loads(line)
        if "loss" in r and "step" in r:
            train.append((r["step"], r["loss"]))
        if "val_loss" in r and "step" in r:
            val.append((r["step"], r["val_loss"]))
    return train, val


def main():
    out, specs = sys.argv[1], sys.argv[2:]
    runs = []
    for s in specs:
        label, path = s.split("=", 1)
        runs.append((label, *read(path)))
    pts = [p for _, t, v in runs for p in t + v]
    if not pts:
        sys.exit("loss_svg: no loss records")
    x1 = max(p[0] for p in pts)
    ys = sorted(p[1] for p in pts)
    y0, y1 = ys[0], ys[int(0.98 * (len(ys) - 1))]  # the first steps' spike would flatten the rest
    W, H, L, R, T, B = 760, 440, 70, 20, 30, 50
    sx = lambda x: L + (W - L - R) * x / x1
    sy = lambda y: T + (H - T - B) * (1 - (min(y, y1) - y0) / (y1 - y0 or 1))
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - R, H - B),
           '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, T, L, H - B)]
    for i in range(6):
        y = y0 + (y1 - y0) * i / 5
        svg.append('<text x="%d" y="%.1f" text-anchor="end">%.2f</text>' % (L - 6, sy(y) + 4, y))
        x = x1 * i / 5
        svg.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (sx(x), H - B + 16, x))
    svg.append('<text x="%d" y="%d" text-anchor="middle">step</text>' % ((L + W - R) // 2, H - 10))
    svg.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">loss (nats/token)</text>' % ((T + H - B) // 2, (T + H - B) // 2))
    print("| run | final training loss (mean of last 5 logged) | best validation loss |")
    print("|---|---|---|")
    for k, (label, t, v) in enumerate(runs):
        c = colors[k % len(colors)]
        if t:
            svg.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (c, " ".join("%.1f,%.1f" % (sx(a), sy(b)) for a, b in t)))
        for a, b in v:
            svg.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (sx(a), sy(b), c))
        svg.append('<text x="%d" y="%d" fill="%s">%s (line: training, dots: validation)</text>' % (L + 10, T + 16 + 16 * k, c, label))
        last = [b for _, b in t[-5:]]
        print("| %s | %.4f | %s |" % (label, sum(last) / len(last) if last else float("nan"), "%.4f" % min(b for _, b in v) if v else "-"))
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


main()
