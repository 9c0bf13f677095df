#!/usr/bin/env python3
"""Module dependency check for MegaC, from the #include lines and the link lines.

usage: check_deps.py [--source DIR] [--build DIR] [--print] [--edges]

  --source DIR  source tree (default: $MC_SOURCE_DIR, else two folders above this file)
  --build DIR   a configured build tree; when given, the offline tools' link lines
                (CMakeFiles/<tool>.dir/link.txt, or build.ninja) are checked too
  --print       print the allowed-dependency table (the one README quotes) and exit
  --edges       also print every module edge found, with one example include each

What fails (exit 1), one line per finding:
  * an include from module A of a header in module B where B is not in ALLOWED[A]
    (upward, sideways, or a skip the table does not allow);
  * a file-level include cycle (a.h includes b.h includes a.h), anywhere, tests and
    bench included;
  * a module-level cycle in the include graph;
  * an mc_<module> library whose CMake LINK list names a library its module may not use;
  * an offline tool (cli/mcreshard, cli/mcaudit, cli/mcplan) that links MPI, CUDA, NCCL,
    mc_train, mc_kernels or mc_comm, directly or through a library (read from
    CMakeLists.txt + cli/<tool>.cmake, and from the build tree's link line if --build).

Includes counted: quoted ones, `#include "x/..."`, resolved the way the compiler does:
first against the including file's own folder (so `#include "cuda_common.h"` inside
kernels/cuda is kernels -> kernels), then against the source root (-I${CMAKE_SOURCE_DIR}).
A quoted include that resolves to no file but whose path starts with a module folder
still counts as an edge to that module.  Others (generated headers such as
mc_default_config.h, system headers) are not project edges.  Comments are stripped
first; includes under #if are counted (the check is conservative).
Python 3 standard library only.
"""

import argparse
import os
import re
import sys

# ----------------------------------------------------------------------------------------
# THE TABLE. Module -> the modules it may depend on (include headers of / link against).
# README's "Dependencies point one way" quotes this table (`check_deps.py --print`).
# Keys in dependency order, bottom first.  A module may always include its own headers.
ALLOWED = {
    "util":    [],
    "core":    ["util"],
    "kernels": ["core", "util"],
    "comm":    ["core", "util"],
    "ckpt":    ["core", "util"],
    "train":   ["kernels", "comm", "ckpt", "core", "util"],
    "reshard": ["ckpt", "core", "util"],
    "plan":    ["ckpt", "core", "util"],
    "cli":     ["train", "reshard", "plan", "kernels", "comm", "ckpt", "core", "util"],
    # The offline tools are cli/ programs held to less: no trainer, kernels or comm,
    # hence no MPI and no CUDA.  Their sources and link lines are checked against these rows.
    "cli/mcreshard": ["reshard", "plan", "ckpt", "core", "util"],
    "cli/mcaudit":   ["reshard", "plan", "ckpt", "core", "util"],
    "cli/mcplan":    ["reshard", "plan", "ckpt", "core", "util"],
}
# Consumers: may include anything; only the file-level include-cycle check covers them.
CONSUMERS = ["bench", "tests"]
# ----------------------------------------------------------------------------------------

MODULES = [m for m in ALLOWED if "/" not in m]
TOOLS = [m for m in ALLOWED if "/" in m]          # "cli/mcplan" ...
SOURCE_EXTS = (".c", ".h", ".cu", ".cuh")
# Libraries no offline tool may link (besides mc_<module> for modules not in its row).
FORBIDDEN_EXTERNAL = re.compile(
    r"^(MPI::|CUDA::|\$\{NCCL_LIBRARY\}|\$\{MPI_|\$\{CUDA_)", re.I)
FORBIDDEN_LIBFILE = re.compile(
    r"^(?:lib)?(mpi\w*|open-pal|open-rte|pmix|cuda|cudart\w*|cublas\w*|cublasLt\w*|"
    r"nccl\w*|culibos|nvrtc\w*|cufft\w*|curand\w*|cusparse\w*|cusolver\w*)(?:\.|$)", re.I)


def print_table(out=sys.stdout):
    w = max(len(k) for k in list(ALLOWED) + CONSUMERS) + 2
    out.write("%-*s%s\n" % (w, "module", "may depend on"))
    for mod, deps in ALLOWED.items():
        out.write("%-*s%s\n" % (w, mod, ", ".join(deps) if deps else "(nothing)"))
    for mod in CONSUMERS:
        out.write("%-*s%s\n" % (w, mod, "(consumer: anything; checked for include cycles only)"))


def may_text(mod):
    deps = ALLOWED[mod]
    if not deps:
        return "%s may depend on no other module" % mod
    return "%s may depend only on %s" % (mod, ", ".join(deps))


def rank_of():
    """Level of each module: 0 for util, 1 + max level of its allowed deps otherwise."""
    rank = {}

    def r(m, seen=()):
        if m in rank:
            return rank[m]
        if m in seen:
            raise SystemExit("check_deps: the ALLOWED table itself has a cycle through %s" % m)
        rank[m] = 1 + max([r(d, seen + (m,)) for d in ALLOWED[m]] or [-1])
        return rank[m]

    for m in ALLOWED:
        r(m)
    return rank


# ---------------------------------------------------------------------------- includes
_TOKENS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.M)


def strip_comments(text):
    def repl(m):
        s = m.group(0)
        if s.startswith("/"):
            return "\n" * s.count("\n") if s.startswith("/*") else ""
        return s
    return _TOKENS.sub(repl, text)


def top_of(rel):
    return rel.split("/", 1)[0]


def unit_of(rel):
    """The table row a file is checked against: the tool row for cli/<tool>.*, else its module."""
    top = top_of(rel)
    if top == "cli":
        stem = os.path.splitext(os.path.basename(rel))[0]
        if rel.count("/") == 1 and "cli/" + stem in ALLOWED:
            return "cli/" + stem
    return top


def scan_files(root):
    files = []
    for top in MODULES + CONSUMERS:
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for fn in sorted(filenames):
                if fn.endswith(SOURCE_EXTS):
                    full = os.path.join(dirpath, fn)
                    files.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return files


def resolve(root, rel, inc):
    """Project-relative path an include names, or None when it is not a project header.
    Returns (path, exists)."""
    here = os.path.dirname(rel)
    cand = os.path.normpath(os.path.join(here, inc)).replace(os.sep, "/")
    if not cand.startswith("../") and os.path.isfile(os.path.join(root, cand)):
        return cand, True
    cand = os.path.normpath(inc).replace(os.sep, "/")
    if not cand.startswith("../") and not os.path.isabs(cand):
        if os.path.isfile(os.path.join(root, cand)):
            return cand, True
        if top_of(cand) in MODULES + CONSUMERS and "/" in cand:
            return cand, False
    return None, False


def collect_includes(root, files):
    """[(file, line, include-as-written, resolved-path, exists)]"""
    out = []
    for rel in files:
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = strip_comments(f.read())
        for m in _INCLUDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            target, exists = resolve(root, rel, m.group(1))
            if target is not None:
                out.append((rel, line, m.group(1), target, exists))
    return out


def sccs(nodes, succ):
    """Tarjan, iterative. Returns strongly connected components (lists)."""
    index, low, on, stack, res = {}, {}, set(), [], []
    counter = [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(succ.get(start, ()))))]
        index[start] = low[start] = counter[0]; counter[0] += 1
        stack.append(start); on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                res.append(comp)
    return res


def a_cycle(comp, succ):
    """One concrete cycle through the smallest node of a strongly connected component."""
    members = set(comp)
    start = min(comp)
    if start in succ.get(start, ()):
        return [start, start]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(succ.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return [start, start]


def check_includes(root, incs, problems, show_edges=False):
    rank = rank_of()
    module_edges = {}                      # (from, to) -> first (file, line, target)
    file_succ = {}
    file_where = {}
    for rel, line, inc, target, exists in incs:
        src, dst = top_of(rel), top_of(target)
        if exists:
            file_succ.setdefault(rel, set()).add(target)
            file_where.setdefault((rel, target), line)
        if src != dst:
            module_edges.setdefault((src, dst), (rel, line, target))
        unit = unit_of(rel)
        if unit in CONSUMERS or dst == src:
            continue
        if dst in ALLOWED.get(unit, ()):
            continue
        if dst in CONSUMERS:
            kind = "module includes a consumer"
        elif rank[dst] > rank[src]:
            kind = "upward edge"
        elif rank[dst] == rank[src]:
            kind = "sideways edge"
        else:
            kind = "edge not in the table"
        problems.append("%s includes %s: %s (%s:%d, %s)"
                        % (rel, target, may_text(unit), rel, line, kind))

    # file-level include cycles
    nodes = sorted(set(file_succ) | {t for s in file_succ.values() for t in s})
    for comp in sccs(nodes, file_succ):
        if len(comp) == 1 and comp[0] not in file_succ.get(comp[0], ()):
            continue
        cyc = a_cycle(comp, file_succ)
        where = ", ".join("%s:%d" % (a, file_where[(a, b)]) for a, b in zip(cyc, cyc[1:]))
        problems.append("include cycle: %s (%s)" % (" -> ".join(cyc), where))

    # module-level cycles
    msucc = {}
    for (a, b) in module_edges:
        msucc.setdefault(a, set()).add(b)
    mnodes = sorted(set(msucc) | {b for s in msucc.values() for b in s})
    for comp in sccs(mnodes, msucc):
        if len(comp) == 1:
            continue
        cyc = a_cycle(comp, msucc)
        why = "; ".join("%s:%d includes %s" % module_edges[(a, b)] for a, b in zip(cyc, cyc[1:]))
        problems.append("module cycle: %s (%s)" % (" -> ".join(cyc), why))

    if show_edges:
        print("module edges found (one example each):")
        for (a, b), (rel, line, target) in sorted(module_edges.items()):
            print("  %-8s -> %-8s %s:%d includes %s" % (a, b, rel, line, target))
    return module_edges


# ---------------------------------------------------------------------------- CMake
_CMAKE_COMMENT = re.compile(r"#[^\n]*")


def cmake_calls(text, name):
    """Argument lists of every `name(...)` call (no nested parentheses in our files)."""
    text = _CMAKE_COMMENT.sub("", text)
    for m in re.finditer(r"\b%s\s*\(([^)]*)\)" % re.escape(name), text, re.I):
        yield m.group(1).split()


def cmake_lib_graph(root):
    """mc_<lib> -> [things it links], from CMakeLists.txt's mc_module and target_link_libraries."""
    path = os.path.join(root, "CMakeLists.txt")
    graph = {}
    if not os.path.isfile(path):
        return graph
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for args in cmake_calls(text, "mc_module"):
        if not args:
            continue
        links = args[args.index("LINK") + 1:] if "LINK" in args else []
        graph.setdefault(args[0], []).extend(links)
    for args in cmake_calls(text, "target_link_libraries"):
        if args and args[0].startswith("mc_"):
            graph.setdefault(args[0], []).extend(
                a for a in args[1:] if a not in ("PUBLIC", "PRIVATE", "INTERFACE"))
    return graph


def tool_links(root, tool):
    """MC_TOOL_LINK of cli/<tool>.cmake (the last set wins), default mc_ckpt as CMakeLists says."""
    links = ["mc_ckpt"]
    path = os.path.join(root, "cli", tool + ".cmake")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for args in cmake_calls(f.read(), "set"):
                if args and args[0] == "MC_TOOL_LINK":
                    links = args[1:]
    return links


def check_cmake(root, problems):
    graph = cmake_lib_graph(root)
    # libraries of modules: an mc_X may link only mc_Y with Y in ALLOWED[X]
    for lib, links in sorted(graph.items()):
        mod = lib[3:]
        if mod not in ALLOWED:
            continue
        for l in links:
            if l.startswith("mc_") and l[3:] != mod and l[3:] not in ALLOWED[mod]:
                problems.append("CMakeLists.txt: %s links %s: %s" % (lib, l, may_text(mod)))
    # offline tools
    for unit in TOOLS:
        tool = unit.split("/", 1)[1]
        if not os.path.isfile(os.path.join(root, unit + ".c")):
            problems.append("%s.c not found: the offline tool is missing or renamed "
                            "(update ALLOWED in tests/deps/check_deps.py)" % unit)
            continue
        seen, order = set(), []
        todo = [(l, [l]) for l in tool_links(root, tool)]
        while todo:
            lib, via = todo.pop(0)
            if lib in seen:
                continue
            seen.add(lib)
            order.append((lib, via))
            for nxt in graph.get(lib, ()):
                todo.append((nxt, via + [nxt]))
        for lib, via in order:
            bad = False
            if lib.startswith("mc_"):
                bad = lib[3:] not in ALLOWED[unit]
            else:
                bad = bool(FORBIDDEN_EXTERNAL.match(lib) or FORBIDDEN_LIBFILE.match(lib))
            if bad:
                chain = " -> ".join(via)
                problems.append("%s links %s (%s, cli/%s.cmake + CMakeLists.txt): offline tools "
                                "link neither MPI, CUDA nor mc_train/mc_kernels/mc_comm"
                                % (unit, lib, chain, tool))


def link_line(build, tool):
    """(where, [tokens]) of the tool's link command in a configured build tree, or (None, None)."""
    txt = os.path.join(build, "CMakeFiles", tool + ".dir", "link.txt")
    if os.path.isfile(txt):
        with open(txt, encoding="utf-8", errors="replace") as f:
            toks = f.read().split()
        out = []
        for t in toks:                      # expand response files (@CMakeFiles/x.dir/linkLibs.rsp)
            if t.startswith("@"):
                rsp = os.path.join(build, t[1:].strip('"'))
                if os.path.isfile(rsp):
                    with open(rsp, encoding="utf-8", errors="replace") as f:
                        out.extend(f.read().split())
                    continue
            out.append(t)
        return txt, out
    ninja = os.path.join(build, "build.ninja")
    if os.path.isfile(ninja):
        with open(ninja, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        for i, l in enumerate(lines):
            if re.match(r"^build %s(\.exe)?: \S*LINKER" % re.escape(tool), l):
                toks = l.split(":", 1)[1].split()
                j = i + 1
                while j < len(lines) and lines[j].startswith(" "):
                    if lines[j].strip().startswith("LINK_LIBRARIES"):
                        toks += lines[j].split("=", 1)[1].split()
                    j += 1
                return ninja, toks
    return None, None


def check_link_lines(build, problems, notes):
    for unit in TOOLS:
        tool = unit.split("/", 1)[1]
        where, toks = link_line(build, tool)
        if where is None:
            notes.append("note: no link line for %s in %s (checked from the CMake files only)"
                         % (tool, build))
            continue
        for t in toks:
            t = t.strip('"')
            if t.startswith("-l"):
                name = t[2:]
            elif re.search(r"\.(a|so)(\.[0-9.]+)?$", t):
                name = os.path.basename(t)
            else:
                continue
            base = re.sub(r"^lib", "", name)
            base = re.sub(r"\.(a|so)(\.[0-9.]+)?$", "", base)
            bad = False
            if base.startswith("mc_"):
                bad = base[3:] not in ALLOWED[unit]
            else:
                bad = bool(FORBIDDEN_LIBFILE.match(base))
            if bad:
                problems.append("%s links %s (%s): offline tools link neither MPI, CUDA nor "
                                "mc_train/mc_kernels/mc_comm"
                                % (unit, t, os.path.relpath(where, build)))


# ---------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default=None)
    ap.add_argument("--build", default=None)
    ap.add_argument("--print", action="store_true", dest="print_table")
    ap.add_argument("--edges", action="store_true")
    args = ap.parse_args(argv)
    rank_of()                                # the table must be acyclic
    if args.print_table:
        print_table()
        return 0
    root = args.source or os.environ.get("MC_SOURCE_DIR") or \
        os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    if not os.path.isdir(root):
        print("check_deps: no source tree at %s" % root, file=sys.stderr)
        return 2
    files = scan_files(root)
    incs = collect_includes(root, files)
    problems, notes = [], []
    check_includes(root, incs, problems, args.edges)
    check_cmake(root, problems)
    if args.build:
        check_link_lines(args.build, problems, notes)
    for n in notes:
        print(n)
    for p in problems:
        print("error: " + p)
    print("check_deps: %d files, %d project includes, %d problem(s)"
          % (len(files), len(incs), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
