"""A retry loop: orders charged through a flaky payment service, then the revenue per
customer and second, exact. An order whose charge fails goes round again with its own
time, up to three attempts; one that fails three times is given up and written to a
dead-letter output. A second of revenue is written once every order in it has been
charged or given up: no order is counted late, none twice.

Two producers write orders (``customer,amount``) into an ingest log through
``lowtide.Front``; the second is slow. Run it with ``python examples/retry_loop.py``;
the suite runs it (tests/test_examples.py) and it checks the revenue against a batch
pass over the log, and the dead letters against the orders that never went through.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

import lowtide
from lowtide.spark.sources.ingest import IngestReader

CUSTOMERS = ["ada", "bob", "cy"]


def attempts_needed(front: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The service's mood, deterministic per order: most orders go through at once,
    some on the 2nd or 3rd attempt, every 17th of front 0 never (99)."""
    order = offset * 2 + front
    need = np.ones(len(order), np.int64)
    need[order % 5 == 1] = 2
    need[order % 7 == 2] = 3
    need[(order % 17 == 0) & (front == 0)] = 99
    return need


def charge(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Charge each order; ``error`` says why one failed (null: charged). The service is
    asked once per attempt (``lt_attempt``: 0, 1, 2)."""
    front, offset = batch["front"].to_numpy(), batch["offset"].to_numpy()
    failed = batch["lt_attempt"].to_numpy() + 1 < attempts_needed(front, offset)
    error = pa.array(np.where(failed, "payment service unavailable", None).tolist(),
                     pa.string())
    return pa.record_batch({"customer": batch["customer"], "amount": batch["amount"],
                            "front": batch["front"], "offset": batch["offset"],
                            "error": error})


def orders(front: Any, stop: threading.Event, pause_s: float) -> None:
    """A producer: an order every ``pause_s``."""
    i = 0
    while not stop.wait(pause_s):
        front.send([f"{CUSTOMERS[i % 3]},{i % 10 + 1}".encode()])
        i += 1


@contextmanager
def producing(fronts: Sequence[Any], pauses_s: Sequence[float]) -> Iterator[threading.Event]:
    """A producer thread per front while the block runs (set the event to stop them
    early); they are stopped and joined when it ends, also when it raises."""
    stop = threading.Event()
    producers = [threading.Thread(target=orders, args=(front, stop, pause))
                 for front, pause in zip(fronts, pauses_s, strict=True)]
    try:
        for p in producers:
            p.start()
        yield stop
    finally:
        stop.set()
        for p in producers:
            if p.is_alive():
                p.join()


def main(spark: Any, work: Path) -> pd.DataFrame:
    # examples/retry_loop.py
    policy = lowtide.RetryPolicy(attempts=3, path=str(work / "retries"))
    with lowtide.Pipeline(spark, "payments") as pipe:
        charged = (pipe.read_log(str(work / "log"))
                   .selectExpr("split(CAST(payload AS STRING), ',')[0] AS customer",
                               "CAST(split(CAST(payload AS STRING), ',')[1] AS DOUBLE) "
                               "AS amount", "front", "offset")
                   .map(charge, "customer string, amount double, front int, offset long",
                        name="charge", retry=policy))          # failed rows go round
        revenue = (charged.window("1 second", key="customer")
                   .agg(orders=("amount", "count"), total=("amount", "sum")))
        pipe.start_tracker(revenue.graph())
        fronts = [pipe.front(f) for f in (0, 1)]
        with producing(fronts, pauses_s=(0.01, 0.1)) as stop:   # the second one is slow
            query = revenue.write_parquet(str(work / "out"), checkpoint=str(work / "ckpt"),
                                          trigger="200 milliseconds")
            stop.wait(3.0)                     # three seconds of orders
        promised = min(front.close() for front in fronts)
        query.wait_for_min_time(promised, timeout_s=300)   # every order charged or given up
        query.stop()
        print(policy.status())                 # RetryCounts(waiting_rows=0, given_up_rows=n)
        got = pd.read_parquet(work / "out")
        dead = pd.read_parquet(policy.dead_letter_path)
    # the end of the example

    log = logged(work / "log", pipe.grid.delta_ms)
    log = log[log["slot"] < promised]
    need = attempts_needed(log["front"].to_numpy(), log["offset"].to_numpy())
    assert set(zip(dead["front"], dead["offset"], strict=True)) == set(
        zip(log["front"][need > 3], log["offset"][need > 3], strict=True)) and len(dead) > 0
    assert policy.status().waiting_rows == 0
    charged_rows = log[need <= 3]
    expected = (charged_rows.assign(start=charged_rows["slot"] // 100)
                .groupby(["customer", "start"])
                .agg(orders=("amount", "size"), total=("amount", "sum")).reset_index())
    ms = pd.to_datetime(got["window_start"], utc=True).map(lambda t: t.value // 1_000_000)
    got = got.assign(start=ms // (100 * pipe.grid.delta_ms))
    cols = ["customer", "start", "orders", "total"]
    full = expected[(expected["start"] + 1) * 100 <= promised]
    mine = got[(got["start"] + 1) * 100 <= promised]
    assert len(full) >= 3
    pd.testing.assert_frame_equal(mine[cols].sort_values(cols).reset_index(drop=True),
                                  full[cols].sort_values(cols).reset_index(drop=True),
                                  check_dtype=False)
    return got


def logged(log: Path, delta_ms: int) -> pd.DataFrame:
    """Every order in the log: front, offset, slot, customer, amount."""
    parts = []
    for f in (0, 1):
        reader = IngestReader(log, f)
        times, payload = reader.read(0, reader.end_offset())
        text = [p.decode().split(",") for p in payload.to_pylist()]
        parts.append(pd.DataFrame({"front": f, "offset": np.arange(len(text)),
                                   "slot": times, "customer": [c for c, _ in text],
                                   "amount": [float(a) for _, a in text]}))
    return pd.concat(parts, ignore_index=True)


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        result = main(SessionConfig().build(), Path(tmp))
        print(result.sort_values(["window_start", "customer"]).to_string(max_rows=30))
