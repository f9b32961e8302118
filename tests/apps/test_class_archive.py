"""`lowtide spark class-archive` (what `make setup` runs) writes the driver JVM's class
archive, and a session started afterwards loads its classes from it: thousands of
classes come from the archive ("shared objects file (top)" in the JVM's class log),
none without it, none from a damaged one (which the JVM skips without a word)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lowtide.spark.session import CLASS_ARCHIVE, FS_JAR, jars_dir

pytestmark = pytest.mark.spark

SESSION = """
import sys
from lowtide.spark import SessionConfig
spark = SessionConfig(ui=False, driver_java_options=f"-Xlog:class+load=info:file={sys.argv[1]}")
print(spark.build().range(3).count())
"""
FROM_ARCHIVE = "shared objects file (top)"


def _classes_from_archive(env: dict[str, str], log: Path) -> int:
    done = subprocess.run([sys.executable, "-c", SESSION, str(log)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr[-2000:]
    assert "cds" not in done.stderr  # a session says nothing about its archive
    return sum(FROM_ARCHIVE in line for line in log.read_text().splitlines())


def _jars_folder(tmp_path: Path) -> Path:
    """A jars folder holding lowtide's file system jar, which the driver's class path
    starts with (an archive is only mapped by a JVM of the class path it was written
    with)."""
    fs_jar = jars_dir() / FS_JAR
    if not fs_jar.is_file():
        pytest.skip("run `make setup`: the class path holds lowtide's file system jar")
    folder = tmp_path / "jars"
    folder.mkdir()
    (folder / FS_JAR).symlink_to(fs_jar)
    return folder


def _class_archive(env: dict[str, str]) -> tuple[list[str], str]:
    done = subprocess.run([sys.executable, "-m", "lowtide.cli", "spark", "class-archive"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines(), done.stderr.strip()


@pytest.mark.slow  # ~60 s: a training run of the demo's queries, then a session
def test_a_session_starts_from_the_archive_setup_wrote(tmp_path: Path) -> None:
    folder = _jars_folder(tmp_path)
    env = {**os.environ, "LOWTIDE_JARS": str(folder)}
    assert _classes_from_archive(env, tmp_path / "before.log") == 0

    lines, errors = _class_archive(env)
    assert len(lines) == 2 and lines[-1].startswith(f"lowtide: wrote {folder / CLASS_ARCHIVE}")
    assert not errors
    assert _classes_from_archive(env, tmp_path / "after.log") > 5_000


@pytest.mark.slow  # ~30 s: the training query fails, `make setup` goes on
def test_a_failed_training_run_writes_nothing_and_lets_setup_go_on(tmp_path: Path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    folder = _jars_folder(tmp_path)
    env = {**os.environ, "LOWTIDE_JARS": str(folder), "PYSPARK_PYTHON": str(broken)}
    lines, errors = _class_archive(env)
    assert len(lines) == 2 and lines[-1].startswith("lowtide: no class archive written (")
    assert lines[-1].endswith("sessions start without one") and not errors
    assert [p.name for p in folder.iterdir()] == [FS_JAR]


def test_a_damaged_archive_is_skipped_silently(tmp_path: Path) -> None:
    """An archive of other jars, another JDK or cut short: the JVM maps none of it,
    says nothing, and the session runs as it would without one."""
    folder = _jars_folder(tmp_path)
    (folder / CLASS_ARCHIVE).write_bytes(os.urandom(1 << 20))
    env = {**os.environ, "LOWTIDE_JARS": str(folder)}
    assert _classes_from_archive(env, tmp_path / "damaged.log") == 0
