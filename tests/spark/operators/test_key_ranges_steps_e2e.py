"""End to end, key ranges through narrow steps (rule 15): a ``where`` and a ``map``
between the generator and the window are split into the window's key ranges, each row
sent and received in its front's range at every step; a fast range's windows come out
while a lagging front's range waits, a task of the ``where`` fails once after its acks
were sent, and every window equals a batch recomputation, none emitted twice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.spark.operators.window_state import window_starts
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once, t0_of_checkpoint
from tests.spark.operators.helpers import GRID, STUCK_MS, all_input, read_results, start_slots
from tests.spark.operators.test_key_ranges_e2e import SIZE, assert_equals_batch

pytestmark = pytest.mark.spark


def with_k(b: pa.RecordBatch) -> pa.RecordBatch:
    """Two keys per front: ``k = front * 10 + seq % 2`` (a key stays in its front's range)."""
    front = b["front"].to_numpy(zero_copy_only=False).astype(np.int64)
    seq = b["seq"].to_numpy(zero_copy_only=False)
    return pa.RecordBatch.from_arrays([b["front"], b["seq"], pa.array(front * 10 + seq % 2)],
                                      names=["front", "seq", "k"])


def batch_windows(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows[rows["seq"] % 3 != 0].assign(k=lambda d: d["front"] * 10 + d["seq"] % 2)
    starts = window_starts(rows["slot"].to_numpy(), SIZE, SIZE)[:, 0]
    return (rows.assign(start=starts).groupby(["k", "start"])
            .agg(n=("seq", "size"), total=("seq", "sum")).reset_index())


def test_ranges_through_where_and_map_emit_early_and_equal_batch(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=4, rate=160.0, payload_bytes=4, lag_ms={3: 20_000})
    pipe = lowtide.Pipeline(spark, "win-ranges-steps", grid=GRID, stuck_after_ms=STUCK_MS)
    # a task of the where fails once after it sent its acks (the next step is in its
    # task): its retry must send the same acks in the same ranges
    after = fail_once(lambda b, p: b % 4 == 2)
    stream = (pipe.generate(spec)
              .where("seq % 3 != 0", name="keep")
              .transform(lambda df: df.mapInArrow(after, df.schema))
              .map(with_k, "front int, seq long, k long", name="addk")
              .window("500 milliseconds", key="k", key_ranges=4, name="win")
              .agg(n="count", total=("seq", "sum")))
    graph = stream.graph()
    assert [graph.ranges_of(graph.index(s)) for s in ("keep", "addk", "win")] == [4, 4, 4]
    assert graph.fronts_of(graph.index("keep")) == {f: {f} for f in range(4)}
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = stream.write_parquet(str(out), checkpoint=str(ckpt), trigger="200 milliseconds")
    try:
        t0 = t0_of_checkpoint(ckpt, query, timeout_s=240)
        query.wait_for_min_time(GRID.slot_of(t0) + 8 * SIZE, timeout_s=240)
        assert not query.stuck()
        agent = pipe.tracker.agent
        ahead = []  # fast ranges' windows written before the lagging range reached them
        for f in sorted(out.glob("*.parquet")):
            lagging = agent.min_time_at("win#3", f.stat().st_mtime_ns // 1_000_000)
            got = pq.read_table(f).to_pandas()
            ends = start_slots(got[got["k"] // 10 != 3]) + SIZE
            ahead += [int(e) for e in ends if e > lagging]
        final = query.min_time()
        doc = agent.status()  # what `lowtide status`, the metrics and the web view show
    finally:
        query.stop()
        pipe.close()
    assert ahead, "no window of a fast range came out before the lagging range reached it"
    ranged = {s["segment"]: s["key_ranges"] for s in doc["segments"] if s.get("key_ranges")}
    assert set(ranged) == {"keep", "addk", "win"} and len(ranged["keep"]) == 4
    assert min(ranged["win"][:3]) > ranged["win"][3], "the lagging range is not the lowest"
    assert_equals_batch(read_results(out), "k", final,
                        lambda horizon: batch_windows(all_input(spec, t0, horizon)))


def test_a_step_that_drops_the_front_is_refused_where_described(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "win-ranges-dropped", grid=GRID)
    gen = pipe.generate(GeneratorSpec(fronts=2, rate=10.0))
    dropped = (gen.select("seq").where("seq >= 0", name="keep")
               .window("500 milliseconds", key="seq", key_ranges=2, name="win").count())
    with pytest.raises(ValueError, match="step 'keep': its rows are split into key ranges"):
        dropped.write_parquet(str(tmp_path / "a"), checkpoint=str(tmp_path / "ca"))
    pipe.close()
