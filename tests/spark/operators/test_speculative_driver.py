"""The driver step's state store (no Spark): a batch reads the state the batch before
it left, a batch run again reads the same, and states no batch can read again go."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lowtide.spark.operators.speculative_driver import ChangelogStore, batch_timestamp_ms


def test_a_batch_reads_the_state_the_batch_before_it_left(tmp_path: Path) -> None:
    assert ChangelogStore.usable(str(tmp_path), "w")
    store = ChangelogStore(str(tmp_path), "w")
    assert store.load(0) == (-1, None)
    store.save(0, (np.array([9]), {"a": 1}), -1)
    store.save(1, (np.array([19]), {"a": 2}), 0)
    read, state = store.load(2)
    assert read == 1 and state is not None and state[1] == {"a": 2}
    # batch 1 run again (a restart before its commit) reads batch 0's state
    read, state = store.load(1)
    assert read == 0 and state is not None and state[1] == {"a": 1}
    store.save(2, None, 1)  # batch 0's state is read by no batch any more
    assert sorted(p.name for p in store.dir.iterdir()) == ["1", "2"]
    assert store.load(3) == (2, None)


def test_a_checkpoint_that_ran_the_keyed_step_keeps_it(tmp_path: Path) -> None:
    """The plan is chosen once per checkpoint: one with batches but no driver state
    ran the changelog on the keyed runtime, whose state lives in Spark's store."""
    old = tmp_path / "old"
    (old / "offsets").mkdir(parents=True)
    (old / "offsets" / "0").write_text("v1\n{}\n")
    assert not ChangelogStore.usable(str(old), "w")
    new = tmp_path / "new"
    assert ChangelogStore.usable(str(new), "w")
    (new / "offsets").mkdir()
    (new / "offsets" / "0").write_text("v1\n{}\n")
    assert ChangelogStore.usable(str(new), "w")  # its restarts keep the plan


def test_the_batch_timestamp_is_the_offset_logs(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1764000000123, "conf": {}}
    (tmp_path / "offsets" / "4").write_text(f"v1\n{json.dumps(meta)}\n{{}}\n")
    assert batch_timestamp_ms(str(tmp_path), 4) == 1764000000123
