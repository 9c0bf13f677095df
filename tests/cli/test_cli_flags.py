"""cli.flags: every training-side tool answers --version and lists its options in --help.

For mctrain, mceval, mcdata, mcaudit and mcplan:
  - `TOOL --version` exits 0 and prints "TOOL (MegaC V)" with V the project VERSION of
    CMakeLists.txt, plus ", checkpoint format F" (F = MC_CKPT_FORMAT_VERSION) for the tools
    that read checkpoints;
  - `TOOL --help` exits 0 and names every long option of the tool's getopt_long table
    (LONG_OPTS in cli/TOOL.c), --config and --set, and every option that README.md or
    docs/*.md use in a command of that tool (a code line or `code span` whose command is TOOL);
  - `--opt=value` is the same as `--opt value` (mcplan --detail, mceval --split).
"""
import os
import re
import subprocess
import sys

SRC = os.environ["MC_SOURCE_DIR"]
BIN = os.environ["MC_BINARY_DIR"]
TOOLS = {"mctrain": True, "mceval": True, "mcaudit": True, "mcdata": False, "mcplan": False}
fails = []


def fail(msg):
    fails.append(msg)
    print("FAIL:", msg)


def run(*args):
    return subprocess.run([os.path.join(BIN, args[0])] + list(args[1:]), capture_output=True, text=True, timeout=30)


version = re.search(r"project\(MegaC VERSION ([0-9.]+)", open(os.path.join(SRC, "CMakeLists.txt")).read()).group(1)
fmt = re.search(r"#define MC_CKPT_FORMAT_VERSION (\d+)", open(os.path.join(SRC, "ckpt/checkpoint.h")).read()).group(1)


def table_options(tool):
    """Long option names of cli/TOOL.c's getopt_long table (and mctrain's launcher options)."""
    text = open(os.path.join(SRC, "cli", tool + ".c")).read()
    table = re.search(r"LONG_OPTS\[\] = \{(.*?)\n\};", text, re.S).group(1)
    names = set(re.findall(r'\{"([a-z0-9-]+)",', table))
    if tool == "mctrain":  # taken out of argv before getopt (take_launch_opts)
        names |= {"nproc-per-node", "nnodes", "node-rank"}
    return names


def doc_options(tool):
    """Options docs use with TOOL: in code-block lines and `spans` whose command is TOOL
    (possibly after build/, sudo, env settings or an mpirun/torchrun prefix). Returns
    {option: "file:line"}."""
    found = {}
    files = [os.path.join(SRC, "README.md")] + sorted(
        os.path.join(SRC, "docs", f) for f in os.listdir(os.path.join(SRC, "docs")) if f.endswith(".md"))
    cmd = re.compile(r"(?:^|[\s/`(])" + tool + r"(?=\s)(.*)")
    for path in files:
        in_code = False
        for n, line in enumerate(open(path), 1):
            if line.startswith("```"):
                in_code = not in_code
                continue
            pieces = [line] if in_code else re.findall(r"`([^`]*)`", line)
            for piece in pieces:
                m = cmd.search(piece)
                if not m:
                    continue
                rest = m.group(1)
                if not in_code:  # a span: the tool must be the command, not a word in prose
                    head = piece[: m.start(1)].strip()
                    if not re.fullmatch(r"(?:.*[\s/])?" + tool, head):
                        continue
                rest = re.split(r"\s#|\|\s", rest)[0] if in_code else rest  # a comment or a shell pipe ends it
                # another tool's command on the same line ends this one (e.g. "a && mceval ...")
                rest = re.split(r"&&|;", rest)[0]
                for opt in re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*)", rest):
                    found.setdefault(opt, "%s:%d" % (os.path.relpath(path, SRC), n))
    return found


for tool, reads_ckpt in TOOLS.items():
    r = run(tool, "--version")
    want = "%s (MegaC %s%s)" % (tool, version, ", checkpoint format %s" % fmt if reads_ckpt else "")
    if r.returncode != 0 or r.stdout.strip() != want:
        fail("%s --version: rc %d, printed %r, want %r; stderr: %s" % (tool, r.returncode, r.stdout.strip(), want, r.stderr.strip()[-2000:]))
    h = run(tool, "--help")
    if h.returncode != 0:
        fail("%s --help: rc %d (%s)" % (tool, h.returncode, h.stderr.strip()))
        continue
    helped = set(re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*)", h.stdout))
    for opt in sorted(table_options(tool) | {"config", "set", "version", "help"}):
        if opt not in helped:
            fail("%s --help does not list --%s (in its option table)" % (tool, opt))
    for opt, where in sorted(doc_options(tool).items()):
        if opt not in helped:
            fail("%s --help does not list --%s, which %s uses" % (tool, opt, where))
    print("%s: --version ok, --help lists %d options" % (tool, len(helped)))

# --opt=value and --opt value are the same option
a, b = run("mcplan", "--detail", "4", "--json"), run("mcplan", "--detail=4", "--json")
if a.returncode != 0 or a.stdout != b.stdout:
    fail("mcplan --detail 4 and --detail=4 differ (rc %d/%d)" % (a.returncode, b.returncode))
for args in (["--split", "bogus"], ["--split=bogus"]):
    r = run("mceval", "ckpt", "--data", "x.h5", *args)
    if r.returncode != 2 or "--split bogus" not in r.stderr:
        fail("mceval %s: rc %d, %r" % (" ".join(args), r.returncode, r.stderr.strip()))
for args in (["--version=1"], ["--vers"]):
    r = run("mceval", *args)
    if r.returncode != 2:
        fail("mceval %s should be refused: rc %d" % (" ".join(args), r.returncode))

if fails:
    print("%d failure(s)" % len(fails))
    sys.exit(1)
print("cli.flags: ok")
