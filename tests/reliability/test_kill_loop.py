#!/usr/bin/python3
"""kill -9 during asynchronous saves (docs/reliability.md, issue 17 CI list): mctrain saves
asynchronously after every step and is killed with SIGKILL at 20 seeded random moments, each
time resumed from `latest`; `latest` must always verify, and the finished run's losses must
equal an uninterrupted run's, digit for digit.

usage: test_kill_loop.py [KILLS]   (MC_BINARY_DIR and MC_SOURCE_DIR from ctest)"""
import os
import random
import signal
import subprocess
import sys
import time

S = os.environ["MC_SOURCE_DIR"]
B = os.environ["MC_BINARY_DIR"]
sys.path.insert(0, os.path.join(S, "tests", "reliability"))
from test_untrusted import SMALL, check, losses, make_run, run, scratch_main  # noqa: E402

STEPS = 40


def args(run_dir):
    # SMALL saves synchronously; a later --set wins
    return [os.path.join(B, "mctrain"), *SMALL, "--set", "checkpoint.async_save=true", "--set", "data.path=corpus.h5",
            "--set", "checkpoint.dir=" + run_dir, "--set", "train.steps=%d" % STEPS, "--set", "checkpoint.every=1",
            "--set", "train.eval_every=0", "--set", "train.log_every=1"]


def body(w):
    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    rnd = random.Random(9)
    make_run(w)  # the corpus (and a run we do not use)
    rc, _, err = run(*args("straight"), cwd=w)
    check(rc == 0, "uninterrupted run: " + err)
    done = 0
    for k in range(kills):
        a = args("k") + (["--resume", "latest"] if os.path.exists(os.path.join(w, "k", "latest")) else [])
        p = subprocess.Popen(a, cwd=w, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rnd.uniform(0.05, 0.6))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            done += 1
        p.wait()
        if os.path.exists(os.path.join(w, "k", "latest")):
            rc, _, err = run(os.path.join(B, "mcaudit"), os.path.join(w, "k"), "--verify", "--no-progress")
            check(rc == 0, "kill %d: latest does not verify: %s" % (k, err))
    a = args("k") + (["--resume", "latest"] if os.path.exists(os.path.join(w, "k", "latest")) else [])
    rc, _, err = run(*a, cwd=w)
    check(rc == 0, "final resume: " + err)
    x, y = losses(os.path.join(w, "straight", "metrics.jsonl")), losses(os.path.join(w, "k", "metrics.jsonl"))
    check(len(x) == STEPS and x == y, "losses differ from the uninterrupted run: %s" %
          [(s, x.get(s), y.get(s)) for s in range(1, STEPS + 1) if x.get(s) != y.get(s)][:5])
    print("kill loop: %d SIGKILLs during async saves, resumed each time; %d steps equal" % (done, len(y)))


if __name__ == "__main__":
    sys.exit(scratch_main("mc_kill_loop_", "test_kill_loop", body))
