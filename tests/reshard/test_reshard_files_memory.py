"""Reshard memory does not grow with the number of rank files.

The tiny synthetic checkpoint (bench_reshard --synth --tiny) is resharded into 16 rank files
and into 256 (parallel.dp with ZeRO 1), then each back into one file; every mcreshard and
mcaudit runs as a fresh process whose peak RSS (os.wait4) is compared. An open HDF5 file
holds about a megabyte of library memory, so a reader or writer that kept every rank file
open would need about 240 MiB more for 256 files than for 16 (it did: 373 MiB against 76 MiB
writing); the bound below is what the per-shard metadata (manifest records, plan entries and
HDF5 datasets) needs: 24 MiB, or 4.5 KiB for each shard the 256-file checkpoint has beyond the
16-file one if that is more (under the balanced-v2 rule ZeRO splits even this model's small
matrices over all 256 members, about 19,400 shards against 1,800; under the balanced rule it
was about 7,100 against 1,600, within 24 MiB). Files kept open would still exceed it by far.
Usage: test_reshard_files_memory.py MCRESHARD MCAUDIT BENCH_RESHARD
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

MCRESHARD, MCAUDIT, BENCH = sys.argv[1:4]
GROWTH_MIB = 24  # allowed growth of peak RSS from 16 to 256 rank files, at least
SHARD_KIB = 4.5  # allowed growth per extra shard
fails = 0


def peak_mib(*cmd):
    """Runs cmd; returns (exit status, peak RSS in MiB, stderr)."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), ru.ru_maxrss / 1024.0, err.read().decode()


def step_dir(d):
    return next(os.path.join(d, e) for e in sorted(os.listdir(d)) if e.startswith("step_"))


def check(ok, what):
    global fails
    print(("ok   " if ok else "FAIL ") + what)
    fails += 0 if ok else 1


work = tempfile.mkdtemp(prefix="mc_rs_files_")
try:
    src = os.path.join(work, "src")
    rc = subprocess.run([BENCH, "--synth", src, "--tiny"], capture_output=True, text=True)
    check(rc.returncode == 0, "synthetic checkpoint: " + rc.stderr.strip())
    peak, shards = {}, {}
    for n in (16, 256):
        dst = os.path.join(work, "d%d" % n)
        rc, w, err = peak_mib(MCRESHARD, src, dst, "--set", "parallel.dp=%d" % n, "--set", "parallel.zero=1",
                              "--set", "train.global_batch=%d" % n, "--no-progress")
        files = [f for f in os.listdir(step_dir(dst)) if f.startswith("rank_")] if rc == 0 else []
        check(rc == 0 and len(files) == n, "reshard into %d rank files (%d written): %s" % (n, len(files), err.strip()[-300:]))
        rc, r, err = peak_mib(MCRESHARD, dst, os.path.join(work, "b%d" % n), "--consolidate", "--no-progress")
        check(rc == 0, "reshard %d rank files into one: %s" % (n, err.strip()[-300:]))
        rc, a, err = peak_mib(MCAUDIT, dst, "--verify", "--no-progress")
        check(rc == 0, "audit of %d rank files: %s" % (n, err.strip()[-300:]))
        peak[n] = (w, r, a)
        with open(os.path.join(step_dir(dst), "manifest.json")) as f:
            shards[n] = len(json.load(f)["shards"])
        print("  %3d files: peak RSS write %.1f MiB, read %.1f MiB, audit %.1f MiB" % (n, w, r, a))
    bound = max(GROWTH_MIB, SHARD_KIB * (shards[256] - shards[16]) / 1024.0)
    print("  shards: %d in 16 files, %d in 256" % (shards[16], shards[256]))
    check(bound < 240, "the bound (%.1f MiB) stays below what 240 more open HDF5 files would cost" % bound)
    for k, what in enumerate(("writing", "reading", "auditing")):
        grow = peak[256][k] - peak[16][k]
        check(grow < bound, "%s 256 instead of 16 rank files adds %.1f MiB (bound %.1f MiB)" % (what, grow, bound))
finally:
    shutil.rmtree(work, ignore_errors=True)
print("test_reshard_files_memory: %d failed" % fails)
sys.exit(1 if fails else 0)
