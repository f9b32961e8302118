"""lowtide's Hadoop local file system (jars/fs): `file:` resolves to it, and it leaves
exactly the permissions Hadoop's own would, without starting a `chmod` process."""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lowtide.spark.session import FS_NO_FORK, fs_jar

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(fs_jar() is None, reason="lowtide-fs.jar not built: run `make setup`"),
]


def _conf(spark: Any) -> Any:
    """A copy of the session's Hadoop configuration, without lowtide's file system."""
    conf = spark._jvm.org.apache.hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
    conf.unset("fs.file.impl")
    return conf


def _spark_default(spark: Any) -> str:
    """The class `file:` resolves to without lowtide's (pyspark: hive-exec's
    ProxyLocalFileSystem, through Hadoop's service loader)."""
    return spark._jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(
        "file", _conf(spark)).getName()


def _local_fs(spark: Any, cls: str, umask: str) -> Any:
    """A fresh (uncached) instance of a local file system class, with Hadoop's umask."""
    jvm = spark._jvm
    conf = _conf(spark)
    conf.set("fs.permissions.umask-mode", umask)
    fs = functools.reduce(getattr, cls.split("."), jvm)()
    fs.initialize(jvm.java.net.URI("file:///"), conf)
    return fs


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): os.stat(p).st_mode for p in sorted(root.rglob("*"))}


def test_file_urls_resolve_to_lowtides_file_system(spark: Any) -> None:
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert fs.getClass().getName() == FS_NO_FORK
    assert fs.getRawFileSystem().getClass().getName() == FS_NO_FORK.replace(
        "NoForkLocal", "NoForkRawLocal")


@pytest.mark.parametrize("umask", ["022", "027"])
def test_permissions_and_renames_are_sparks_defaults(
        spark: Any, tmp_path: Path, umask: str) -> None:
    """The same calls through the file system `file:` is without lowtide's (a chmod
    process each) and lowtide's leave the same modes: new files and folders under
    Hadoop's umask, .crc files, explicit permissions, a sticky bit, a folder's
    set-group-ID bit kept; and neither renames over an existing file."""
    jvm = spark._jvm
    perm = jvm.org.apache.hadoop.fs.permission.FsPermission
    default = _spark_default(spark)
    renamed = []
    for cls in (default, FS_NO_FORK):
        root = tmp_path / cls
        (root / "setgid").mkdir(parents=True)
        os.chmod(root / "setgid", 0o2770)
        fs = _local_fs(spark, cls, umask)

        def path(name: str, root: Path = root) -> Any:
            return jvm.org.apache.hadoop.fs.Path(str(root / name))

        fs.mkdirs(path("a/b/c"))
        fs.create(path("a/b/c/data")).close()
        fs.mkdirs(path("private"), perm("700"))
        fs.create(path("private/key")).close()
        fs.setPermission(path("private/key"), perm("600"))
        fs.mkdirs(path("shared"))
        fs.setPermission(path("shared"), perm("1777"))
        fs.setPermission(path("setgid"), perm("750"))
        renamed.append((fs.rename(path("a/b/c/data"), path("private/key")),
                        fs.rename(path("a/b/c/data"), path("a/b/c/moved"))))
        fs.close()
    plain, mine = (_modes(tmp_path / cls) for cls in (default, FS_NO_FORK))
    assert renamed == [(False, True)] * 2
    assert mine == plain
    assert stat.S_IMODE(mine["setgid"]) == 0o2750 and ".crc" in "".join(mine)
    assert stat.S_IMODE(mine["a/b/c/moved"]) == 0o666 & ~int(umask, 8)


def test_a_checkpointed_query_leaves_hadoops_permissions(spark: Any, tmp_path: Path) -> None:
    """A stateful query over three micro-batches (offsets, commits, state, Parquet files
    and their .crc): results as ever, files 0644 and folders 0755 (Hadoop's umask 022)."""
    source = tmp_path / "in"
    source.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"id": list(range(i * 5, i * 5 + 10))}),
                       source / f"part-{i}.parquet")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (spark.readStream.schema("id long").option("maxFilesPerTrigger", 1)
             .parquet(str(source)).dropDuplicates(["id"])
             .writeStream.format("parquet").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start(str(out)))
    query.awaitTermination(120)
    assert query.exception() is None and query.lastProgress["batchId"] == 2
    ids = sorted(r.id for r in spark.read.parquet(str(out)).collect())
    assert ids == list(range(20))
    modes = {**_modes(out), **{f"cp/{k}": v for k, v in _modes(checkpoint).items()}}
    assert any(name.endswith(".crc") for name in modes) and len(modes) > 20
    wrong = {name: oct(stat.S_IMODE(mode)) for name, mode in modes.items()
             if stat.S_IMODE(mode) != (0o755 if stat.S_ISDIR(mode) else 0o644)}
    assert wrong == {}
