"""``lowtide bench keys``' judging, on worked examples (no Spark): which windows count,
when one is on time, the batch recomputation it judges against."""

from __future__ import annotations

import math

import pandas as pd

from lowtide.bench import keys
from lowtide.spark.sources import GeneratorSpec


def test_on_time_counts_batch_windows_in_the_judged_span() -> None:
    batch = pd.DataFrame({"user": [0, 1, 3, 0], "start_ms": [0, 0, 0, 2000],
                          "end_ms": [2000, 2000, 2000, 4000]})
    got = pd.DataFrame({"user": [0, 1, 1, 3], "start_ms": [0, 0, 0, 0],
                        "done_ms": [2500, 4000, 3000, 7500]})  # key 1 twice: its first
    # judged: windows ending in [2000, 2000]: key 0 on time (500 ms), key 1 (1000 ms)
    # on time within 1250, key 3 late (5500 ms)
    assert keys.on_time(got, batch, (2000, 2000), 1250) == round(2 / 3, 3)
    assert keys.on_time(got, batch, (0, 4000), 1250) == 0.5  # (0, 2000): never emitted
    assert math.isnan(keys.on_time(got, batch, (5000, 6000), 1250))


def test_batch_windows_are_per_front_and_end_before_the_horizon() -> None:
    spec = GeneratorSpec(fronts=2, rate=20.0, t0_ms=1_000)  # 10 rows/s per front
    batch = keys.batch_windows(spec, 5_000)
    assert set(batch["user"]) == {0, 1}
    assert batch["end_ms"].max() <= 5_000 and (batch["end_ms"] - batch["start_ms"] == 2000).all()
    full = batch[batch["start_ms"] == 2_000]
    assert full["n"].tolist() == [20, 20]  # two seconds of 10 rows/s, each front


def test_judge_a_way_that_emitted_the_batch_with_one_window_late_and_one_lost() -> None:
    cfg = keys.KeysConfig(lag_ms=2_000)
    spec = GeneratorSpec(fronts=2, rate=20.0, t0_ms=0)
    batch = keys.batch_windows(spec, 12_000)
    got = batch.assign(done_ms=batch["end_ms"] + 100)
    got.loc[(got["user"] == 1) & (got["start_ms"] == 4_000), "done_ms"] = 4_000 + 2_000 + 900
    exact = keys.judge(got, spec, cfg, (4_000, 12_000), 12_000, 0)
    # judged: windows ending in [4000, 8000]: 3 per front, one of front 1 late (900 ms)
    assert exact["on_time"] == round(5 / 6, 3) and exact["matches_batch"] is True
    assert exact["rows_lost"] == 0 and exact["windows"] == len(batch)
    lossy = keys.judge(got.assign(n=got["n"] - (got["user"] == 0)), spec, cfg,
                       (4_000, 12_000), 12_000, 7)
    assert lossy["matches_batch"] is False and lossy["rows_lost"] == 6
    assert lossy["dropped_by_watermark"] == 7


def test_a_key_is_judged_up_to_its_own_last_window() -> None:
    cfg = keys.KeysConfig(lag_ms=2_000)
    spec = GeneratorSpec(fronts=2, rate=20.0, t0_ms=0)
    batch = keys.batch_windows(spec, 12_000)
    # front 1's range lags: its windows after 6000 are not out yet; the sink's min
    # time is 6000: nothing is missing
    got = batch[(batch["user"] == 0) | (batch["end_ms"] <= 6_000)]
    got = got.assign(done_ms=got["end_ms"] + 100)
    ahead = keys.judge(got, spec, cfg, (0, 12_000), 6_000, 0)
    assert ahead["matches_batch"] is True and ahead["rows_lost"] == 0
    behind = keys.judge(got[got["end_ms"] <= 4_000], spec, cfg, (0, 12_000), 6_000, 0)
    assert behind["matches_batch"] is False  # windows below the sink's min time missing
