"""What the CLI tests share: running ``lowtide`` as a user does, in its own process."""

from __future__ import annotations

import os
import subprocess
import sys

LOWTIDE = [sys.executable, "-m", "lowtide.cli"]
NOISE = ("Traceback", " ERROR ", "BrokenPipe", "Exception in thread",
         "TransformWithStateInPandas Python worker", "Setting default log level")


def run_clean(*argv: str) -> str:
    """Run a command; assert it succeeded without noise; its stdout."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([*LOWTIDE, *argv], capture_output=True, text=True, timeout=600,
                          env=env)
    both = done.stdout + done.stderr
    assert done.returncode == 0, both[-3000:]
    lines = both.splitlines()
    noisy = [i for i, line in enumerate(lines) if any(n in line for n in NOISE)]
    # the whole first stack trace, so a rare one says where it came from
    assert noisy == [], "\n".join(lines[max(0, noisy[0] - 5):noisy[0] + 60])
    return done.stdout
