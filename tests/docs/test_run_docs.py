#!/usr/bin/env python3
"""Self-test of run_docs.py on synthetic documents and stand-in programs: the convention
(what runs, markers, untagged command blocks), here-documents and continuations, console
prompts, output blocks, failure reports (document, line, command, output tail), and the
--help flag check."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run_docs.py")
TOOLS = ["mctrain", "mceval", "mcdata", "mcplan", "mcreshard", "mcaudit"]
failures = 0
roots = []


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures += 1


def tree(docs):
    root = tempfile.mkdtemp(prefix="rdt-")
    roots.append(root)
    src, b = os.path.join(root, "src"), os.path.join(root, "bin")
    os.makedirs(os.path.join(src, "docs"))
    os.makedirs(b)
    open(os.path.join(src, "README.md"), "w").write("# x\n")
    for name, text in docs.items():
        open(os.path.join(src, name), "w").write(text)
    for t in TOOLS:
        p = os.path.join(b, t)
        # --help lists --known; mcdata writes its -o file (the runner makes a corpus with it)
        open(p, "w").write('#!/bin/sh\n[ "$1" = --help ] && { echo "usage: %s [--known] [-o F]"; exit 0; }\n'
                           'if [ "$1" = -o ]; then : > "$2"; fi\n'
                           'echo "%s ran: $*"; [ "$1" = --fail ] && { echo "boom on stderr" >&2; exit 3; }\n'
                           'exit 0\n' % (t, t))
        os.chmod(p, 0o755)
    return src, b


def run(src, b, *extra):
    p = subprocess.run([sys.executable, RUN, "--src", src, "--bin", b, "--timeout", "20", *extra],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return p.returncode, p.stdout.decode()


# 1. a passing document: sh with continuation and here-document, console, output, skip, gpu
good = """# Good

```sh
mctrain --known \\
  --known                # a continuation
cat > f.json <<'EOF'
{"a": 1}
EOF
grep -q '"a"' f.json
```

```console
$ mcplan --known
some sample output that is not run
```

<!-- docs-test: output mcplan --known -->
```text
mcplan ran: --known
```

<!-- docs-test: skip needs root -->
```sh
apt-get install nothing
```

<!-- docs-test: gpu -->
```sh
mctrain --known cuda
```

```
layers.00.attn.wk [32, 64]   (untagged, not command-like: fine)
```

Inline: `mcaudit --known` and a bare `--whatever`.
"""
src, b = tree({"docs/good.md": good})
rc, out = run(src, b)
check(rc == 0, "a passing document exits 0\n" + out)
check("docs/good.md:4 mctrain --known" in out, "the continued command runs, named by its first line")
check("docs/good.md:13 mcplan --known" in out, "a console prompt runs; its output lines do not")
check("output of: mcplan --known" in out, "an output block is compared")
check("skip docs/good.md:24 (needs root)" in out, "a skipped block is reported with its reason")
check("gpu  docs/good.md:29" in out, "a gpu block is listed, not run")
rc, out = run(src, b, "--list-gpu")
check(rc == 0 and "mctrain --known cuda" in out and "apt-get" not in out, "--list-gpu prints the gpu block only")
rc, out = run(src, b, "--gpu")
check(rc == 0 and "ok" in out and "docs/good.md:29 mctrain --known cuda" in out, "--gpu runs the gpu block too")

# 2. failures: a failing command, an output block that differs, convention errors, a flag not in --help
slow = """# Slow

```sh
(sleep 300; echo never) &  sleep 300
```
"""
bad = """# Bad

```sh
mcdata --known
mceval --fail here
mctrain --known
```
"""
bad2 = """# Bad2

<!-- docs-test: output mcplan --known -->
```text
something mcplan never prints
```

```
mpirun -np 2 mctrain --known
```

<!-- docs-test: skip -->
```sh
true
```

<!-- docs-test: frobnicate -->
```sh
true
```

Use `mcreshard --not-a-flag` here.

<!-- docs-test: skip a marker with a blank line after it -->

```sh
true
```
"""
src, b = tree({"docs/bad.md": bad, "docs/bad2.md": bad2})
rc, out = run(src, b)
check(rc == 1, "failures exit 1")
check("FAIL docs/bad.md:5: exit status 3" in out and "$ mceval --fail here" in out and "boom on stderr" in out,
      "a failing command is named by document, line, status, and its output tail\n" + out)
check("docs/bad.md:6" not in out, "the document stops at its first failure")
check("FAIL docs/bad2.md:5" in out and "regenerate" in out, "a stale output block fails")
check("docs/bad2.md:9: untagged code block starts like a command" in out, "an untagged command block fails")
check("'docs-test: skip' needs a reason" in out, "skip without a reason fails")
check("unknown docs-test marker 'frobnicate'" in out, "an unknown marker fails")
check("FAIL docs/bad2.md:22: mcreshard --not-a-flag is not in `mcreshard --help`" in out, "a flag missing from --help fails")
check("FAIL docs/bad2.md:9: mctrain" not in out, "flags known to --help pass")
check("docs/bad2.md:24: docs-test marker not directly above a code block" in out, "a marker away from its block fails")

for r in roots:
    shutil.rmtree(r, ignore_errors=True)
# 3. a command past its limit is ended with its children (the pipe closes), and reported
src, b = tree({"docs/slow.md": slow})
t0 = time.time()
p = subprocess.run([sys.executable, RUN, "--src", src, "--bin", b, "--timeout", "2"],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
out = p.stdout.decode()
check(p.returncode == 1 and "FAIL docs/slow.md:4: timed out after 2.0 s" in out and time.time() - t0 < 30,
      "a command past --timeout is ended with its children and reported\n" + out)

print("test_run_docs: %s" % ("ok" if failures == 0 else "%d failed" % failures))
sys.exit(1 if failures else 0)
