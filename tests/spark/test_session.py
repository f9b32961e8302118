"""SessionConfig settings and the local jars lookup (no Spark started)."""

from pathlib import Path

import pytest

from lowtide.spark.session import (
    DELTA_PACKAGE,
    KAFKA_PACKAGE,
    JarsMissing,
    SessionConfig,
    session_jars,
)


def _jars(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_no_parts_need_no_jars(tmp_path: Path) -> None:
    assert session_jars(kafka=False, delta=False, folder=tmp_path / "none") == []


def test_kafka_jars_are_found_without_delta(tmp_path: Path) -> None:
    folder = _jars(tmp_path, "spark-sql-kafka-0-10_2.13-4.2.0.jar", "kafka-clients-3.9.2.jar",
                   "delta-spark_4.2_2.13-4.4.0.jar")
    names = [Path(j).name for j in session_jars(kafka=True, delta=False, folder=folder)]
    assert names == ["kafka-clients-3.9.2.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"]


@pytest.mark.parametrize(("kafka", "package"), [(True, KAFKA_PACKAGE), (False, DELTA_PACKAGE)])
def test_a_missing_part_names_the_fix(tmp_path: Path, kafka: bool, package: str) -> None:
    with pytest.raises(JarsMissing, match="make setup") as err:
        session_jars(kafka=kafka, delta=not kafka, folder=tmp_path)
    assert package in str(err.value) and "--packages" in str(err.value)


def test_delta_settings_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _jars(tmp_path, "delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar")
    monkeypatch.setenv("LOWTIDE_JARS", str(folder))
    conf = SessionConfig(delta=True, conf=(("spark.sql.shuffle.partitions", "8"),)).settings()
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.jars"].count(".jar") == 2
    assert conf["spark.sql.shuffle.partitions"] == "8"


def test_quiet_sessions_read_the_log_file_from_their_first_line() -> None:
    from lowtide.spark.session import QUIET_LOG4J2, quiet_log4j2_file

    conf = SessionConfig().settings()
    option = f"-Dlog4j2.configurationFile=file:{quiet_log4j2_file()}"
    assert option in conf["spark.driver.extraJavaOptions"].split()
    assert option in conf["spark.executor.extraJavaOptions"].split()
    assert quiet_log4j2_file().read_text() == QUIET_LOG4J2
    loud = SessionConfig(quiet=False, master=None).settings()
    assert "log4j2" not in loud["spark.driver.extraJavaOptions"]


def test_local_sessions_rename_checkpoint_files_without_a_process() -> None:
    """Local checkpoints go through the FileSystem API (a rename is a system call),
    not FileContext (a `readlink` process per renamed file); a cluster keeps Spark's."""
    from lowtide.spark.session import FS_CHECKPOINTS

    key = "spark.sql.streaming.checkpointFileManagerClass"
    assert SessionConfig().settings()[key] == FS_CHECKPOINTS
    assert key not in SessionConfig(master=None).settings()
    assert key not in SessionConfig(master="spark://head:7077").settings()


def test_local_file_system_without_chmod_processes_where_its_jar_was_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With jars/spark/lib/lowtide-fs.jar, `file:` is lowtide's file system: the jar on
    the driver's class path (it resolves fs.file.impl), and in spark.jars where the
    executors run in other JVMs."""
    from lowtide.spark.session import FS_IMPL, FS_NO_FORK

    folder = _jars(tmp_path, "lowtide-fs.jar")
    monkeypatch.setenv("LOWTIDE_JARS", str(folder))
    jar = str(folder / "lowtide-fs.jar")
    conf = SessionConfig().settings()
    assert conf[FS_IMPL] == FS_NO_FORK
    assert conf["spark.driver.extraClassPath"] == jar and "spark.jars" not in conf
    for master in ("spark://head:7077", "local-cluster[2,1,1024]", None):
        assert SessionConfig(master=master).settings()["spark.jars"] == jar
    for off in (SessionConfig().settings(fs=False),  # a JVM up without the class
                SessionConfig(conf=((FS_IMPL, "my.Fs"),)).settings()):  # a user's wins
        assert off.get(FS_IMPL) != FS_NO_FORK
        assert "spark.jars" not in off and "spark.driver.extraClassPath" not in off
    mine = SessionConfig(master=None, conf=(("spark.jars", "/x/my.jar"),
                               ("spark.driver.extraClassPath", "/x/cp"))).settings()
    assert mine["spark.jars"] == f"/x/my.jar,{jar}"
    assert mine["spark.driver.extraClassPath"] == f"/x/cp:{jar}"


def test_without_the_jar_hadoops_file_system_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from lowtide.spark.session import FS_IMPL

    monkeypatch.setenv("LOWTIDE_JARS", str(tmp_path))
    with caplog.at_level("INFO", logger="lowtide.spark.session"):
        conf = SessionConfig().settings()
    assert FS_IMPL not in conf and "spark.jars" not in conf
    assert "make setup" in caplog.text


def test_the_driver_starts_from_the_class_archive_setup_wrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where `make setup` wrote the class archive, the driver's JVM (only it: executors
    of a cluster run other jars) maps it, quietly; ``class_archive=False`` or no archive
    leaves the options as they were; more driver options come after lowtide's."""
    from lowtide.spark.session import CLASS_ARCHIVE

    folder = _jars(tmp_path / "jars dir", CLASS_ARCHIVE)
    monkeypatch.setenv("LOWTIDE_JARS", str(folder))
    archive = f"'-XX:SharedArchiveFile={folder / CLASS_ARCHIVE}'"  # quoted: a space
    for master in ("local[2]", "spark://head:7077"):
        conf = SessionConfig(master=master, driver_java_options="-Dx=1").settings()
        driver = conf["spark.driver.extraJavaOptions"]
        assert archive in driver and "-Xlog:cds=off" in driver
        assert driver.startswith("-Xss32m") and driver.endswith("-Dx=1")
        assert "Archive" not in conf["spark.executor.extraJavaOptions"]
    off = SessionConfig(class_archive=False).settings()["spark.driver.extraJavaOptions"]
    (folder / CLASS_ARCHIVE).unlink()
    absent = SessionConfig().settings()["spark.driver.extraJavaOptions"]
    assert "Archive" not in off and off == absent
