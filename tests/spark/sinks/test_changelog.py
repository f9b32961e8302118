"""Reading a changelog: the latest state (pandas and Spark), the finals, and a Delta
table kept up to date batch by batch with the documented MERGE."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sinks.changelog import finals, merge_sql

# two batches of a window's changelog: key a shows v1, then v2; key b shows its final
# at once; key a's v2 is final in the second batch (tombstone v2, v3 final); a null
# aggregate folds like any value
BATCHES = [
    [("a", 0, 1.0, "insert", 1, False), ("b", 0, None, "insert", 1, True)],
    [("a", 0, 1.0, "tombstone", 1, False), ("a", 0, 3.0, "insert", 2, False)],
    [("a", 0, 3.0, "tombstone", 2, False), ("a", 0, 4.0, "insert", 3, True)],
]
COLUMNS = ["user", "window_start", "total", "op", "version", "is_final"]


def frame(upto: int) -> pd.DataFrame:
    return pd.DataFrame([r for b in BATCHES[:upto] for r in b], columns=COLUMNS)


def latest(df: pd.DataFrame) -> list[tuple[object, ...]]:
    return sorted((r.user, r.version, None if pd.isna(r.total) else r.total, bool(r.is_final))
                  for r in df.itertuples())


def test_apply_changelog_keeps_the_versions_no_tombstone_cancels() -> None:
    assert latest(lowtide.apply_changelog(frame(1))) == [("a", 1, 1.0, False),
                                                         ("b", 1, None, True)]
    assert latest(lowtide.apply_changelog(frame(2))) == [("a", 2, 3.0, False),
                                                         ("b", 1, None, True)]
    assert latest(lowtide.apply_changelog(frame(3))) == [("a", 3, 4.0, True),
                                                         ("b", 1, None, True)]
    assert sorted(finals(frame(3))["user"]) == ["a", "b"]
    assert list(finals(frame(3)).columns) == ["user", "window_start", "total"]


def test_a_frame_without_the_changelog_columns_is_refused() -> None:
    with pytest.raises(ValueError, match="not a changelog: no column 'op'"):
        lowtide.apply_changelog(pd.DataFrame({"user": ["a"]}))


@pytest.mark.slow  # ~1-2 min (Delta MERGE); the fold runs by default in test_speculative_e2e
@pytest.mark.spark
def test_spark_fold_and_the_delta_merge_agree(spark, tmp_path: Path) -> None:
    schema = "user string, window_start long, total double, op string, version long, " \
             "is_final boolean"
    table = str(tmp_path / "latest")
    spark.createDataFrame([], schema).write.format("delta").save(table)
    for i, batch in enumerate(BATCHES, start=1):
        df = spark.createDataFrame(batch, schema)
        df.createOrReplaceTempView("changes")
        spark.sql(merge_sql(f"delta.`{table}`", "changes", ["user"]))
        merged = spark.read.format("delta").load(table).toPandas()
        folded = lowtide.apply_changelog(spark.createDataFrame(frame(i), schema)).toPandas()
        assert latest(merged) == latest(folded) == latest(lowtide.apply_changelog(frame(i)))


def test_a_folds_changelog_names_its_slot_and_its_finals_drop_it() -> None:
    """A fold's version may hold several rows (each cancelled by its own tombstone);
    ``finals`` drops ``slot_start`` as well (the plain ``stateful``'s output); the
    MERGE takes the columns that name a row besides the keys."""
    cols = ["user", "n", "slot_start", "op", "version", "is_final"]
    log = pd.DataFrame([("a", 1, 0, "insert", 1, False), ("a", -1, 0, "insert", 1, False),
                        ("a", 1, 0, "tombstone", 1, False), ("a", -1, 0, "tombstone", 1, False),
                        ("a", 2, 0, "insert", 2, True), ("a", 5, 1, "insert", 1, False)],
                       columns=cols)
    assert sorted(lowtide.apply_changelog(log)[["n", "version"]].values.tolist()) == \
        [[2, 2], [5, 1]]
    assert list(finals(log).columns) == ["user", "n"] and finals(log)["n"].tolist() == [2]
    sql = merge_sql("t", "s", ["user"], on=["slot_start", "n"])
    assert "ON t.`user` <=> s.`user` AND t.`slot_start` <=> s.`slot_start` AND " \
           "t.`n` <=> s.`n` AND t.`version` <=> s.`version` WHEN" in sql
    assert "t.`window_start` <=> s.`window_start`" in merge_sql("t", "s", ["user"])
