#!/usr/bin/env python3
"""Docs that run (issue 18): every command in README.md and docs/*.md runs as written.

Convention (also in tests/docs/README.md):

  ```sh / ```bash / ```shell   commands; every logical line (a trailing backslash joins lines,
                               a here-document runs to its terminator) is one command
  ```console                   lines starting with "$ " are commands, the others sample output
  ```text, ```json, ```c, ...  never run (synopses, sample output, code)
  ```  (no language)           never run; but a block whose lines start like a command
                               (mctrain, mpirun, cmake, scripts/..., ...) is an error: tag it
                               sh (runs) or text (a synopsis or output: never runs)

  Markers: HTML comments on the lines directly above an opening fence (no blank line between):
  <!-- docs-test: skip REASON -->  a command block that is not run here (installs as root,
                                   several hosts, the whole suite); listed with its reason
  <!-- docs-test: gpu -->          a command block that needs an NVIDIA GPU: not run here,
                                   listed by --list-gpu and run by --gpu on a GPU machine
  <!-- docs-test: setup CMD -->    CMD runs before the block: it may only create the stand-in
                                   inputs the text presumes (run.json, a.txt, ids.bin), never
                                   change what a command of the block does
  <!-- docs-test: env VAR=V ... --> variables for the block's commands
  <!-- docs-test: output CMD -->   on a text block: CMD runs there, and the block's lines must
                                   appear in its output in order ("..." lines stand for any
                                   lines; trailing blanks ignored)

Each document runs in a fresh copy of the source tree (configs/, docs/, scripts/, ...; not
.git, build*, runs, data: about 4 MB), plus data/default_corpus.h5,
made by mcdata from docs/*.md: a small stand-in for the default corpus that
scripts/train-default.sh builds from Debian packages. Its commands run in order, each in its
own `bash -o pipefail -c` from that directory, with the build's programs first on PATH,
OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1 and Open MPI allowed to run as root and to oversubscribe (CI: 2 cores, root).

Also checks that every --flag the docs give a MegaC program (in any code block or inline code
span, after the program's name) appears in that program's --help.
"""
import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TOOLS = ["mctrain", "mceval", "mcdata", "mcplan", "mcreshard", "mcaudit"]
RUN_LANGS = {"sh", "bash", "shell", "console"}
# words that start a command line: an untagged block starting so must be tagged sh or text
COMMAND_WORDS = set(TOOLS) | {"mpirun", "torchrun", "srun", "cmake", "ctest", "make", "bash", "sh",
                              "sudo", "apt-get", "python3", "git", "cd", "env", "OUT", "bench_ckpt",
                              "bench_load", "h5dump", "tensorboard"}
MARKER_RE = re.compile(r"^\s*<!--\s*docs-test:\s*(\w[\w-]*)\s*(.*?)\s*-->\s*$")
FENCE_RE = re.compile(r"^(\s{0,3})```\s*([\w+-]*)\s*$")


class Block:
    def __init__(self, doc, line, lang, lines, markers):
        self.doc, self.line, self.lang, self.lines, self.markers = doc, line, lang, lines, markers

    def marker(self, key):
        return [v for k, v in self.markers if k == key]


def parse_doc(path, rel):
    """Fenced blocks of one markdown file, with their markers. Returns (blocks, problems)."""
    text = open(path, encoding="utf-8").read().split("\n")
    blocks, problems = [], []
    i = 0
    while i < len(text):
        m = FENCE_RE.match(text[i])
        if not m:
            if "docs-test:" in text[i] and not MARKER_RE.match(text[i]):
                problems.append(f"{rel}:{i + 1}: malformed docs-test marker: {text[i].strip()}")
            elif MARKER_RE.match(text[i]):
                k = i
                while k + 1 < len(text) and MARKER_RE.match(text[k + 1]):
                    k += 1
                if k + 1 >= len(text) or not FENCE_RE.match(text[k + 1]):
                    problems.append(f"{rel}:{i + 1}: docs-test marker not directly above a code block "
                                    f"(no blank line between): {text[i].strip()}")
            i += 1
            continue
        lang = m.group(2)
        markers = []
        k = i - 1
        while k >= 0 and MARKER_RE.match(text[k]):
            mm = MARKER_RE.match(text[k])
            markers.insert(0, (mm.group(1), mm.group(2)))
            k -= 1
        j = i + 1
        while j < len(text) and not re.match(r"^\s{0,3}```\s*$", text[j]):
            j += 1
        if j >= len(text):
            problems.append(f"{rel}:{i + 1}: code block never closed")
            break
        blocks.append(Block(rel, i + 1, lang, text[i + 1:j], markers))
        i = j + 1
    return blocks, problems


def first_word(line):
    """The command word of a line, past leading VAR=value assignments."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        words = line.split()
    for w in words:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w):
            continue
        return w
    return ""


def looks_like_command(line):
    w = first_word(line)
    if not w or w.endswith(":"):
        return False
    return w in COMMAND_WORDS or re.match(r"^(scripts|build[\w-]*|bench|\.)/\S", w) is not None


def check_block(b):
    """Convention errors of one block."""
    out = []
    known = {"skip", "gpu", "setup", "env", "output"}
    for k, v in b.markers:
        if k not in known:
            out.append(f"{b.doc}:{b.line}: unknown docs-test marker '{k}'")
        if k == "skip" and not v:
            out.append(f"{b.doc}:{b.line}: 'docs-test: skip' needs a reason")
        if k in ("setup", "output") and not v:
            out.append(f"{b.doc}:{b.line}: 'docs-test: {k}' needs a command")
        if k == "output" and b.lang in RUN_LANGS:
            out.append(f"{b.doc}:{b.line}: 'docs-test: output' belongs on a text block, not ```{b.lang}")
        if k in ("skip", "gpu", "setup", "env") and b.lang not in RUN_LANGS:
            out.append(f"{b.doc}:{b.line}: 'docs-test: {k}' on a ```{b.lang or ''} block, which never runs")
    if b.lang in RUN_LANGS and b.marker("skip") and b.marker("gpu"):
        out.append(f"{b.doc}:{b.line}: both skip and gpu")
    if b.lang == "":
        for n, l in enumerate(b.lines):
            if looks_like_command(l):
                out.append(f"{b.doc}:{b.line + 1 + n}: untagged code block starts like a command "
                           f"({l.strip()[:60]!r}): tag it ```sh (the docs test runs it) or ```text (never run)")
                break
    return out


def commands_of(b):
    """(line number, command) of a command block: logical lines, here-documents included."""
    cmds = []
    lines = b.lines
    i = 0
    while i < len(lines):
        raw = lines[i]
        start = b.line + 1 + i
        if b.lang == "console":
            if not raw.startswith("$ "):
                i += 1
                continue
            raw = raw[2:]
        cmd = raw
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            nxt = lines[i]
            if b.lang == "console" and nxt.startswith("> "):
                nxt = nxt[2:]
            cmd = cmd + "\n" + nxt
        hd = re.search(r"<<-?\s*(['\"]?)(\w+)\1", cmd)
        if hd:
            term = hd.group(2)
            while i + 1 < len(lines):
                i += 1
                cmd += "\n" + lines[i]
                if lines[i].strip() == term:
                    break
        i += 1
        if cmd.strip() == "" or cmd.strip().startswith("#"):
            continue
        cmds.append((start, cmd))
    return cmds


def tail(text, n=15):
    lines = text.replace("\r", "\n").rstrip("\n").split("\n")
    return "\n".join("      | " + l for l in lines[-n:])


class Runner:
    def __init__(self, args):
        self.args = args
        self.fail = []
        self.skipped = []
        self.gpu = []
        self.ran = 0
        self.env = dict(os.environ)
        self.env["PATH"] = args.bin + os.pathsep + self.env.get("PATH", "")
        self.env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                         "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                         "OMPI_MCA_rmaps_base_oversubscribe": "1"})
        self.env.pop("MC_SOURCE_DIR", None)

    def sh(self, cmd, cwd, env, timeout):
        t0 = time.time()
        # its own process group, so that a timeout ends mpirun and the ranks too, not only bash
        p = subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                out, _ = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
            rc = "timeout"
        return rc, out.decode("utf-8", "replace"), time.time() - t0

    def workdir(self, rel):
        d = os.path.join(tempfile.mkdtemp(prefix="doc-", dir=self.args.workdir), "tree")
        # a copy, so that no command of a document can write into the source tree (about 4 MB)
        shutil.copytree(self.args.src, d, symlinks=True,
                        ignore=lambda where, names: [n for n in names if where == self.args.src and (
                            n in (".git", "runs", "data", ".device") or n.startswith("build"))])
        os.mkdir(os.path.join(d, "data"))
        shutil.copy(self.corpus, os.path.join(d, "data", "default_corpus.h5"))
        return d

    def make_corpus(self):
        self.corpus = os.path.join(self.args.workdir, "default_corpus.h5")
        docs = sorted(os.path.join(self.args.src, "docs", f) for f in os.listdir(os.path.join(self.args.src, "docs"))
                      if f.endswith(".md"))
        rc, out, _ = self.sh(shlex.join(["mcdata", "-o", self.corpus] + docs), self.args.workdir, self.env, 60)
        if rc != 0:
            sys.exit(f"run_docs: could not make the stand-in corpus:\n{out}")

    def report_fail(self, where, cmd, why, out):
        self.fail.append(where)
        print(f"FAIL {where}: {why}\n    $ {cmd}\n{tail(out)}", flush=True)

    def run_doc(self, rel, blocks, with_gpu):
        runnable = [b for b in blocks if (b.lang in RUN_LANGS and not b.marker("skip")
                                          and (with_gpu or not b.marker("gpu"))) or b.marker("output")]
        for b in blocks:
            if b.lang not in RUN_LANGS:
                continue
            for ln, cmd in commands_of(b):
                if b.marker("skip"):
                    self.skipped.append((f"{rel}:{ln}", b.marker("skip")[0], cmd))
                elif b.marker("gpu") and not with_gpu:
                    self.gpu.append((f"{rel}:{ln}", cmd))
        if not runnable:
            return
        d = self.workdir(rel)
        print(f"== {rel} (in {d})", flush=True)
        for b in runnable:
            env = dict(self.env)
            for e in b.marker("env"):
                for kv in shlex.split(e):
                    k, _, v = kv.partition("=")
                    env[k] = v
            for s in b.marker("setup"):
                rc, out, dt = self.sh(s, d, env, self.args.timeout)
                if rc != 0:
                    self.report_fail(f"{rel}:{b.line} (setup)", s, f"exit {rc}", out)
                    return
            for o in b.marker("output"):
                rc, out, dt = self.sh(o, d, env, self.args.timeout)
                self.ran += 1
                if rc != 0:
                    self.report_fail(f"{rel}:{b.line} (output)", o, f"exit {rc}", out)
                    return
                bad = match_output(b.lines, out)
                if bad:
                    self.report_fail(f"{rel}:{b.line + 1}", o,
                                     f"the block is not this command's output (first differing part: {bad!r}); "
                                     f"regenerate it from the command's output", out)
                else:
                    print(f"ok   {dt:5.1f}s {rel}:{b.line + 1} output of: {o}", flush=True)
            if b.lang not in RUN_LANGS:
                continue
            for ln, cmd in commands_of(b):
                rc, out, dt = self.sh(cmd, d, env, self.args.timeout)
                self.ran += 1
                short = cmd.replace("\\\n", " ").replace("\n", " ; ")
                if rc != 0:
                    why = f"timed out after {self.args.timeout} s" if rc == "timeout" else f"exit status {rc}"
                    self.report_fail(f"{rel}:{ln}", cmd, why, out)
                    print(f"    (the rest of {rel} is not run: its commands build on each other)", flush=True)
                    return
                print(f"ok   {dt:5.1f}s {rel}:{ln} {short[:150]}", flush=True)
        if not self.args.keep:
            shutil.rmtree(os.path.dirname(d), ignore_errors=True)


def match_output(block_lines, out):
    """None when every segment of block_lines (cut at '...' lines) appears, lines contiguous,
    in order in out; else the first segment line not found."""
    have = [l.rstrip() for l in out.replace("\r", "\n").split("\n")]
    segs, cur = [], []
    for l in block_lines:
        if l.strip() == "...":
            segs.append(cur)
            cur = []
        else:
            cur.append(l.rstrip())
    segs.append(cur)
    pos = 0
    for seg in segs:
        if not seg:
            continue
        found = -1
        for s in range(pos, len(have) - len(seg) + 1):
            if have[s:s + len(seg)] == seg:
                found = s
                break
        if found < 0:
            # name the first line of the segment that does not follow
            for s in range(pos, len(have)):
                if have[s] == seg[0]:
                    for n, l in enumerate(seg):
                        if s + n >= len(have) or have[s + n] != l:
                            return l
            return seg[0]
        pos = found + len(seg)
    return None


# ------------------------------------------------------------------ flags against --help
SPAN_RE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
TOOL_RE = re.compile(r"(?:^|[\s/(\[])(" + "|".join(TOOLS) + r")(?=\s|$)")
FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def flags_in(seg):
    """(tool, flag) pairs of one command-like string."""
    pairs = []
    ms = list(TOOL_RE.finditer(seg))
    for n, m in enumerate(ms):
        end = ms[n + 1].start() if n + 1 < len(ms) else len(seg)
        part = seg[m.end():end]
        part = re.split(r"&&|;|\s\|\s|\s#|\s(?:mpirun|torchrun|srun|env)\s", part)[0]
        part = re.sub(r"'[^']*'", "", part)
        for f in FLAG_RE.findall(part):
            pairs.append((m.group(1), f))
    return pairs


def doc_flag_uses(rel, text, blocks):
    uses = []  # (tool, flag, where)
    in_block = set()
    for b in blocks:
        for n in range(b.line, b.line + len(b.lines) + 2):
            in_block.add(n)
        prev_tool = None
        for n, l in enumerate(b.lines):
            where = f"{rel}:{b.line + 1 + n}"
            pairs = flags_in(l)
            if TOOL_RE.search(l):
                prev_tool = TOOL_RE.search(l).group(1) if not l[:1].isspace() or not prev_tool else prev_tool
            elif b.lang not in RUN_LANGS and l[:1].isspace() and prev_tool:
                # a synopsis continued on indented lines
                pairs = [(prev_tool, f) for f in FLAG_RE.findall(re.sub(r"'[^']*'", "", l))]
            elif b.lang in RUN_LANGS and prev_tool and b.lines[n - 1].endswith("\\"):
                pairs = [(prev_tool, f) for f in FLAG_RE.findall(re.sub(r"'[^']*'", "", l))]
            else:
                prev_tool = None
            uses += [(t, f, where) for t, f in pairs]
    for n, l in enumerate(text.split("\n")):
        if n + 1 in in_block:
            continue
        for s in SPAN_RE.findall(l):
            uses += [(t, f, f"{rel}:{n + 1}") for t, f in flags_in(s)]
    return uses


def help_flags(bindir):
    out = {}
    for t in TOOLS:
        exe = os.path.join(bindir, t)
        p = subprocess.run([exe, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out[t] = set(FLAG_RE.findall(p.stdout.decode("utf-8", "replace"))) | {"--help"}
    return out


def load_gaps(path):
    gaps = set()
    if os.path.exists(path):
        for l in open(path):
            l = l.split("#")[0].split()
            if len(l) == 2:
                gaps.add((l[0], l[1]))
    return gaps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=os.environ.get("MC_SOURCE_DIR", "."), help="source tree")
    ap.add_argument("--bin", default=os.environ.get("MC_BINARY_DIR", "build"), help="build dir with the programs")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per command (default 60)")
    ap.add_argument("--workdir", default=None, help="where the per-document directories go (default $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the per-document directories")
    ap.add_argument("--list-gpu", action="store_true", help="print the GPU-marked commands as a script and exit")
    ap.add_argument("--gpu", action="store_true", help="also run the GPU-marked blocks (on a GPU machine)")
    ap.add_argument("--no-run", action="store_true", help="check the convention and the flags only")
    ap.add_argument("docs", nargs="*", help="documents (default README.md and docs/*.md)")
    a = ap.parse_args()
    a.src, a.bin = os.path.abspath(a.src), os.path.abspath(a.bin)
    docs = a.docs or ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(a.src, "docs"))
                                            if f.endswith(".md"))
    parsed, problems = {}, []
    for rel in docs:
        blocks, p = parse_doc(os.path.join(a.src, rel), rel)
        problems += p
        for b in blocks:
            problems += check_block(b)
        parsed[rel] = blocks

    if a.list_gpu:
        print("# GPU-marked commands of the docs (tests/docs/run_docs.py --list-gpu). Run each document's")
        print("# commands in order from a copy of the source tree with the programs on PATH, or use")
        print("#   tests/docs/run_docs.py --gpu --src . --bin BUILD DOC.md   (runs the whole document)")
        print("# data/default_corpus.h5 stands for any mcdata output: mcdata -o data/default_corpus.h5 docs/*.md")
        for rel, blocks in parsed.items():
            for b in blocks:
                if b.lang in RUN_LANGS and b.marker("gpu"):
                    print(f"\n# {rel}:{b.line}")
                    for s in b.marker("setup"):
                        print(f"{s}   # setup")
                    for e in b.marker("env"):
                        print(f"export {e}")
                    for ln, cmd in commands_of(b):
                        print(cmd)
        return 0

    t_start = time.time()
    for p in problems:
        print(f"FAIL {p}")

    # flags against --help
    helps = help_flags(a.bin)
    gaps = load_gaps(os.path.join(os.path.dirname(os.path.abspath(__file__)), "flag_gaps.txt"))
    used_gaps = set()
    flag_fail = 0
    for rel, blocks in parsed.items():
        text = open(os.path.join(a.src, rel), encoding="utf-8").read()
        for t, f, where in doc_flag_uses(rel, text, blocks):
            if f in helps[t]:
                continue
            if (t, f) in gaps:
                used_gaps.add((t, f))
                print(f"gap  {where}: {t} {f} is not in `{t} --help` (known: tests/docs/flag_gaps.txt)")
                continue
            flag_fail += 1
            print(f"FAIL {where}: {t} {f} is not in `{t} --help`")
    for t, f in sorted(gaps):
        if f in helps[t]:
            flag_fail += 1
            print(f"FAIL tests/docs/flag_gaps.txt: {t} {f} is in `{t} --help` now: remove the line")

    r = Runner(a)
    if not a.no_run:
        a.workdir = a.workdir or tempfile.gettempdir()
        a.workdir = tempfile.mkdtemp(prefix="docs-", dir=a.workdir)
        r.make_corpus()
        for rel, blocks in parsed.items():
            r.run_doc(rel, blocks, a.gpu)
        if not a.keep:
            shutil.rmtree(a.workdir, ignore_errors=True)

    for where, why, cmd in r.skipped:
        print(f"skip {where} ({why}): {cmd.splitlines()[0]}")
    for where, cmd in r.gpu:
        print(f"gpu  {where} (not run: needs a GPU; --list-gpu): {cmd.splitlines()[0]}")
    nfail = len(problems) + flag_fail + len(r.fail)
    print(f"docs: {r.ran} commands run, {len(r.skipped)} skipped, {len(r.gpu)} GPU-only, "
          f"{len(problems)} convention problems, {flag_fail} flag problems, {len(r.fail)} failed commands; "
          f"{time.time() - t_start:.0f} s")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
