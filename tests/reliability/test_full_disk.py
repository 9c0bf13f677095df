#!/usr/bin/python3
"""A full disk during a save or a reshard (docs/reliability.md, issue 17 item 3): the disk is
made full by an LD_PRELOAD shim (enospc_shim.c: writes to the step's or destination's
temporary files fail with ENOSPC after a budget of bytes), at several budgets. Every time the
tool must exit 1 with "not committed (previous checkpoint kept)", never die of a signal, leave
the previous checkpoint verifying and nothing of the failed write behind.

usage: test_full_disk.py SHIM.so   (MC_BINARY_DIR and MC_SOURCE_DIR from ctest)"""
import glob
import json
import os
import shutil
import sys

S = os.environ["MC_SOURCE_DIR"]
B = os.environ["MC_BINARY_DIR"]
sys.path.insert(0, os.path.join(S, "tests", "reliability"))
from test_untrusted import SMALL, check, make_run, run, scratch_main  # noqa: E402

BUDGETS = [0, 3000, 100000, 600000]  # bytes written before the disk is full


def full(env_match, budget):
    # ASan (an MC_SANITIZE build) wants to come first; the shim must precede libc's write.
    asan = os.environ.get("ASAN_OPTIONS", "")
    env = dict(os.environ, LD_PRELOAD=sys.argv[1], MC_ENOSPC_MATCH=env_match, MC_ENOSPC_AFTER=str(budget),
               ASAN_OPTIONS=(asan + ":" if asan else "") + "verify_asan_link_order=0")
    return env


def leftovers(d):
    return [p for p in glob.glob(os.path.join(d, "*")) if p.endswith(".tmp") or p.endswith(".trash")]


def body(w):
    make_run(w)  # run/step_2 committed
    for budget in BUDGETS:
        r = os.path.join(w, "r%d" % budget)
        shutil.copytree(os.path.join(w, "run"), r)
        rc, out, err = run(os.path.join(B, "mctrain"), *SMALL,
                               "--set", "data.path=corpus.h5", "--set", "checkpoint.dir=" + os.path.basename(r),
                               "--set", "train.steps=4", "--set", "checkpoint.every=2", "--resume", "latest", cwd=w,
                           env=full("step_4.tmp", budget))
        check(rc == 1 and "not committed (previous checkpoint kept)" in err,
              "mctrain, disk full after %d bytes: rc %d %s" % (budget, rc, err.strip()[-400:]))
        with open(os.path.join(r, "latest")) as f:
            check(json.load(f)["step"] == 2, "mctrain: latest moved")
        check(not leftovers(r), "mctrain left %s" % leftovers(r))
        rc, _, err = run(os.path.join(B, "mcaudit"), r, "--verify", "--no-progress")
        check(rc == 0, "mctrain, disk full after %d bytes: the previous checkpoint no longer verifies: %s" % (budget, err))
        dst = os.path.join(w, "d%d" % budget)
        rc, _, err = run(os.path.join(B, "mcreshard"), os.path.join(w, "run"), dst, "--consolidate", "--no-progress",
                         env=full("d%d.reshard.tmp" % budget, budget))
        check(rc == 1 and "not committed (previous checkpoint kept)" in err and not os.path.exists(dst),
              "mcreshard, disk full after %d bytes: rc %d %s" % (budget, rc, err.strip()[-400:]))
        check(not glob.glob(dst + ".*"), "mcreshard left %s" % glob.glob(dst + ".*"))
    print("full disk: %d budgets x (mctrain save, mcreshard)" % len(BUDGETS))


if __name__ == "__main__":
    sys.exit(scratch_main("mc_full_disk_", "test_full_disk", body))
