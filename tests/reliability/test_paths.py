#!/usr/bin/python3
"""Paths, locks and bounded metadata reads of the tools (docs/reliability.md, issue 17 items
4 to 8), each case a failure of 910feca:

  special:  an existing output that is not a regular file (a FIFO standing in for /dev/full)
            is refused by mcreshard --export and mcdata -o, and stays what it was;
  overlap:  a destination that is, contains or lies inside a source is refused (mcreshard
            RUN RUN/step_N --force, mcreshard RUN/step_N RUN --force, --export into the
            source, mcdata -o IN IN) and the source still verifies;
  locks:    while another process holds the run directory's lock (or a reshard
            destination's), mctrain --resume and mcreshard exit 1 "in use by pid N";
  sizes:    mceval on a manifest whose model was edited to d_model = 65536 refuses it before
            allocating (item 8);
  fifo:     a FIFO named latest (or manifest.json a link to /dev/zero, or a 17 MiB latest)
            makes every reader exit non-zero at once, never block or read without bound.

usage: test_paths.py   (MC_BINARY_DIR and MC_SOURCE_DIR from ctest; Debian's /usr/bin/python3)"""
import fcntl
import glob
import os
import shutil
import stat
import sys
import tempfile

B = os.environ["MC_BINARY_DIR"]
S = os.environ["MC_SOURCE_DIR"]
sys.path.insert(0, os.path.join(S, "tests", "reliability"))
from test_untrusted import SMALL, check, make_run, run  # noqa: E402
import test_untrusted  # noqa: E402
sys.path.insert(0, os.path.join(S, "tests", "ckpt"))
from ckpt_edit import rewrite_manifest  # noqa: E402

def tool(name):
    return os.path.join(B, name)


def audit_ok(run_dir, what):
    rc, _, err = run(tool("mcaudit"), run_dir, "--verify", "--no-progress")
    check(rc == 0, what + ": the source no longer verifies: " + err)


def special(w):
    fifo = os.path.join(w, "out.fifo")
    os.mkfifo(fifo)
    rc, _, err = run(tool("mcreshard"), os.path.join(w, "run"), "--export", fifo, timeout=30)
    check(rc == 1 and "not a regular file" in err, "--export onto a FIFO refused: rc %d %s" % (rc, err))
    rc, _, err = run(tool("mcdata"), "-o", fifo, os.path.join(S, "README.md"), timeout=30)
    check(rc != 0 and "not a regular file" in err, "mcdata -o onto a FIFO refused: rc %d %s" % (rc, err))
    check(stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced")


def overlap(w):
    r = os.path.join(w, "run")
    sd = glob.glob(os.path.join(r, "step_*"))[0]
    for args, what in (((r, sd, "--force"), "DST inside SRC"), ((sd, r, "--force"), "DST contains SRC"),
                       ((r, r, "--force"), "DST is SRC"),
                       ((r, "--export", os.path.join(sd, "rank_0.h5")), "--export into the source")):
        rc, _, err = run(tool("mcreshard"), *args, "--no-progress")
        check(rc == 1 and "refusing to overwrite" in err, "mcreshard %s refused: rc %d %s" % (what, rc, err))
    audit_ok(r, "after the overlapping mcreshard")
    txt = os.path.join(w, "in.txt")
    with open(txt, "w") as f:
        f.write("some text for mcdata\n" * 20)
    before = open(txt, "rb").read()
    rc, _, err = run(tool("mcdata"), "-o", txt, txt)
    check(rc != 0 and "refusing to overwrite" in err and open(txt, "rb").read() == before,
          "mcdata -o in.txt in.txt refused, input intact: rc %d %s" % (rc, err))


def hold(path):
    f = open(path, "a+")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.truncate(0)
    f.write("%d\n" % os.getpid())
    f.flush()
    return f


def locks(w):
    r = os.path.join(w, "run")
    held = hold(os.path.join(r, ".mctrain.lock"))
    rc, _, err = run(tool("mctrain"), *SMALL, "--set", "data.path=corpus.h5", "--set", "checkpoint.dir=run",
                     "--set", "train.steps=3", "--resume", "latest", cwd=w)
    check(rc == 1 and "in use by pid %d" % os.getpid() in err, "second mctrain on a run directory: rc %d %s" % (rc, err))
    held.close()
    dst = os.path.join(w, "dst")
    held = hold(dst + ".reshard.lock")
    rc, _, err = run(tool("mcreshard"), r, dst, "--consolidate", "--no-progress")
    check(rc == 1 and "in use by pid %d" % os.getpid() in err and not os.path.exists(dst),
          "second mcreshard to one destination: rc %d %s" % (rc, err))
    held.close()
    rc, _, err = run(tool("mcreshard"), r, dst, "--consolidate", "--no-progress")
    check(rc == 0 and not os.path.exists(dst + ".reshard.lock"), "mcreshard once the lock is free: " + err)


def readers(w, r):
    return [[tool("mcaudit"), r, "--no-progress"], [tool("mceval"), r, "--data", os.path.join(w, "corpus.h5")],
            [tool("mcreshard"), r, os.path.join(w, "never"), "--no-progress"],
            [tool("mctrain"), *SMALL, "--set", "data.path=corpus.h5", "--set", "checkpoint.dir=" + os.path.basename(r),
             "--set", "train.steps=3", "--resume", "latest"]]


def fifo(w):
    r = os.path.join(w, "run_fifo")
    for label, make, why in (
            ("FIFO latest", lambda: (os.unlink(os.path.join(r, "latest")), os.mkfifo(os.path.join(r, "latest"))),
             "not a regular file"),
            ("latest of 17 MiB", lambda: os.truncate(os.path.join(r, "latest"), 17 << 20), "MiB"),
            ("manifest.json -> /dev/zero",
             lambda: [(os.unlink(p), os.symlink("/dev/zero", p)) for p in glob.glob(os.path.join(r, "step_*", "manifest.json"))],
             "not a regular file")):
        shutil.rmtree(r, ignore_errors=True)
        shutil.copytree(os.path.join(w, "run"), r)
        make()
        for argv in readers(w, r):
            rc, _, err = run(*argv, cwd=w, timeout=30)
            check(rc in (1, 2) and why in err, "%s: %s: rc %d %s" % (label, os.path.basename(argv[0]), rc, err.strip()[-300:]))


def sizes(w):
    """An edited manifest (model.d_model = 65536, consistent in every hash) must not make mceval
    reserve the memory of that model before it compares it with the shards."""
    r = os.path.join(w, "run_big")
    shutil.copytree(os.path.join(w, "run"), r)

    def edit(m, _):
        m["model"]["d_model"] = 65536
        m["config"]["model"]["d_model"] = 65536
    rewrite_manifest(r, edit)
    rc, _, err = run(tool("mceval"), r, "--data", os.path.join(w, "corpus.h5"), timeout=60)
    check(rc == 1 and "shaped differently" in err, "mceval with an edited model size: rc %d %s" % (rc, err.strip()[-300:]))


def main():
    w = tempfile.mkdtemp(prefix="mc_paths_")
    try:
        make_run(w)
        if test_untrusted.failures == 0:
            special(w)
            overlap(w)
            locks(w)
            fifo(w)
            sizes(w)
    finally:
        shutil.rmtree(w, ignore_errors=True)
    total = test_untrusted.failures  # every check counts there
    print("test_paths: %d failures" % total)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
