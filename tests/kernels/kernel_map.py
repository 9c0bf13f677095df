#!/usr/bin/env python3
"""docs/kernels.md's op table against the code: every function pointer of struct mc_backend
(kernels/ops.h) has exactly one row; every file named exists; the function the CPU table
(cpu_backend.c) installs for the op is defined in the CPU file named; the CUDA file named first
is the one whose code sets `be-><op> = ...` (cuda_profile.cu, which wraps the finished table,
aside), and that function is defined there. Exit 0 when all hold."""
import os
import re
import sys

root = os.environ.get("MC_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
def read(rel):
    with open(os.path.join(root, rel)) as f:
        return f.read()

errors = []
ops_h = read("kernels/ops.h")
body = ops_h[ops_h.index("struct mc_backend {"):]
body = body[:body.index("\n};")]
ops = re.findall(r"\(\*(\w+)\)\s*\(", body)

rows = {}
for line in read("docs/kernels.md").splitlines():
    m = re.match(r"^\|\s*(\w+)\s*\|\s*([\w.]+)\s*\|\s*([\w., ]+?)\s*\|\s*$", line)
    if not m or m.group(1) == "op":
        continue
    op, cpu, cuda = m.group(1), m.group(2), [f.strip() for f in m.group(3).split(",")]
    if op in rows:
        errors.append(f"{op}: more than one row")
    rows[op] = (cpu, cuda)

for op in ops:
    if op not in rows:
        errors.append(f"{op}: no row in docs/kernels.md")
for op in rows:
    if op not in ops:
        errors.append(f"{op}: row for something that is not an op of struct mc_backend")

def defines(src, fn):
    return re.search(r"^[\w *]*?\b" + re.escape(fn) + r"\(", src, re.M) is not None

cpu_table = read("kernels/cpu/cpu_backend.c")
cuda_dir = os.path.join(root, "kernels/cuda")
cuda_src = {f: read("kernels/cuda/" + f) for f in sorted(os.listdir(cuda_dir)) if f.endswith(".cu")}
for op, (cpu, cuda) in sorted(rows.items()):
    files = ["kernels/cpu/" + cpu] + ["kernels/cuda/" + f for f in cuda]
    missing = [f for f in files if not os.path.isfile(os.path.join(root, f))]
    if missing:
        errors.append(f"{op}: no such file {', '.join(missing)}")
        continue
    m = re.search(r"^\s*\." + op + r"\s*=\s*(\w+)\s*,", cpu_table, re.M)
    if not m:
        errors.append(f"{op}: not in the CPU table (cpu_backend.c)")
    elif not defines(read("kernels/cpu/" + cpu), m.group(1)):
        errors.append(f"{op}: the CPU table's {m.group(1)} is not defined in {cpu}")
    setters = [(f, s.group(1)) for f, src in cuda_src.items() if f != "cuda_profile.cu"
               for s in re.finditer(r"\bbe->" + op + r"\s*=\s*(\w+)\s*;", src)]
    if [f for f, _ in setters] != [cuda[0]]:
        errors.append(f"{op}: set by {[f for f, _ in setters] or 'no file'}, the table says {cuda[0]}")
    elif not defines(cuda_src[cuda[0]], setters[0][1]):
        errors.append(f"{op}: {setters[0][1]} is not defined in {cuda[0]}")

for e in errors:
    print("kernel_map:", e)
print(f"kernel_map: {len(ops)} ops, {len(rows)} rows, {len(errors)} problems")
sys.exit(1 if errors else 0)
