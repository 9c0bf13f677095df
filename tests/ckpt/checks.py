"""check() and run() shared by the python tests of tools: a failed check is counted and
printed, not raised, so one run reports every failure; `failures` (read it as
checks.failures) is the count a test's exit status comes from."""
import subprocess

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAILED:", what)


def run(*args, env=None):
    """(exit status, stdout, stderr) of a command; env=None keeps the environment."""
    p = subprocess.run(list(args), capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr
