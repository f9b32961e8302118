"""`pip install lowtide[spark]` from a built wheel, in a fresh venv, runs
`lowtide walkthrough` (issue 23, packaging).

Offline: the wheel is built without build isolation by an interpreter that has
setuptools and wheel (this one, else Debian's python3), and installed with
``--no-index`` into a fresh venv that sees the shared venv's packages (pyspark and
the other extras' dependencies) through a directory of links, lowtide itself left
out, so pip resolves ``[spark]`` against them and the wheel's lowtide is the only
one there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import lowtide

ROOT = Path(__file__).parents[2]
BUILDERS = (sys.executable, "/usr/bin/python3")


def builder() -> str:
    for python in BUILDERS:
        probe = [python, "-c", "import setuptools, wheel, pip"]
        if Path(python).exists() and subprocess.run(probe, capture_output=True).returncode == 0:
            return python
    pytest.skip("no interpreter with setuptools, wheel and pip to build the wheel offline")


def build_wheel(tmp: Path) -> Path:
    """Built from a copy, so the worktree gets no build/ or egg-info."""
    source = tmp / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    wheels = tmp / "wheels"
    cmd = ["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run(
        [builder(), *cmd, "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = wheels.glob("lowtide-*.whl")
    return wheel


def shared_packages_without_lowtide(tmp: Path) -> Path:
    """Links to the shared site-packages' entries, minus lowtide and .pth files
    (an editable lowtide would come back through them)."""
    links = tmp / "shared"
    links.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        ours = entry.name.lower().startswith(("lowtide", "__editable__"))
        if not ours and entry.suffix != ".pth":
            (links / entry.name).symlink_to(entry)
    return links


def fresh_venv(tmp: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    (Path(purelib) / "shared.pth").write_text(f"{shared_packages_without_lowtide(tmp)}\n")
    return venv


def test_the_wheel_installs_with_the_spark_extra_and_runs_the_walkthrough(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    assert wheel.name.startswith(f"lowtide-{lowtide.__version__}-py3-none-any")
    venv = fresh_venv(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    done = subprocess.run(
        [*pip, "install", "--no-index", f"lowtide[spark] @ {wheel.as_uri()}"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    walk = subprocess.run(
        [venv / "bin" / "lowtide", "walkthrough"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )
    assert walk.returncode == 0 and "Traceback" not in walk.stderr, walk.stderr
    assert json.loads(walk.stdout.splitlines()[-1])["stuck"]
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import lowtide; print(lowtide.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True,
    ).stdout.strip()
    assert where.startswith(str(venv)), where  # the wheel's, not the source tree's
    version = subprocess.run(
        [venv / "bin" / "lowtide", "--version"],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True,
    ).stdout.strip()
    assert version == f"lowtide {lowtide.__version__}"
