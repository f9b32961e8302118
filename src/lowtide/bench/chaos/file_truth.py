"""What the file sinks' fault kinds of ``lowtide bench chaos --spark`` share: producers
writing Parquet files of records with unique ids through a ``lowtide.Front`` (the ground
truth), the output read back, and the judgement of a sink's announced min time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lowtide.bench.chaos.run import Result

SCHEMA = "rid long, lt_time long, lt_ack long"
TRIGGER = "300 milliseconds"


class Producer:
    """A front writing Parquet files of records with unique ids; the ground truth."""

    def __init__(self) -> None:
        self.next_id = 0
        self.written: dict[int, int] = {}  # record id -> lt_time

    def write(self, producer: Any, n: int) -> int:
        """``n`` records through ``producer``; returns their slot."""
        import pandas as pd

        ids = range(self.next_id, self.next_id + n)
        batch = producer.send(pd.DataFrame({"rid": list(ids)}))
        self.written.update(zip(ids, batch.times.tolist(), strict=True))
        self.next_id += n
        return int(batch.times.max())


def produce(producers: list[Any], ground: Producer, rounds: int,
            timeout_s: float = 300) -> list[int]:
    """``rounds`` batches of 20 records per producer, 0.3 s apart; returns, per
    producer, a slot its front's heartbeat has passed, above all it labelled (or
    TimeoutError when one never passes it within ``timeout_s``)."""
    last = [0] * len(producers)
    for _ in range(rounds):
        last = [ground.write(p, 20) for p in producers]
        time.sleep(0.3)
    deadline = time.monotonic() + timeout_s
    for p, top in zip(producers, last, strict=True):
        while p.front.heartbeat() <= top:
            if time.monotonic() > deadline:
                raise TimeoutError(f"front {p.front.front}'s heartbeats stayed at its "
                                   f"last label {top} for {timeout_s:g} s")
            time.sleep(0.05)
    return [top + 1 for top in last]


def rows_of(folder: Path, names: list[str] | None = None) -> dict[int, int]:
    """rid -> lt_time of the Parquet files in ``folder`` (or only ``names``)."""
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    out: dict[int, int] = {}
    paths = ([folder / n for n in names] if names is not None
             else sorted(folder.glob("part-*.parquet")))
    for path in paths:
        t = pq.read_table(path, columns=["rid", "lt_time"]).to_pydict()
        out.update(zip(t["rid"], t["lt_time"], strict=True))
    return out


def early(claimed: int, expected: dict[int, int], have: dict[int, int]) -> list[int]:
    """Records below ``claimed`` that are not in ``have``."""
    return [rid for rid, t in expected.items() if t < claimed and rid not in have]


def note_premature(result: Result, claimed: int, expected: dict[int, int],
                   have: dict[int, int], what: str = "") -> None:
    """A premature note on ``result`` if a record below ``claimed`` is not in ``have``."""
    missing = early(claimed, expected, have)
    if missing:
        result.premature.append(f"{what}min time {claimed} announced, {len(missing)} "
                                "records below it not in the output")


def run_and_stop(query: Any, produce_to: Callable[[], int], result: Result,
                 timeout_s: float) -> int:
    """Wait until ``query``'s sink passes the slot ``produce_to()`` returns (a timeout
    is a note), stop it, and return the sink's min time it claimed."""
    try:
        query.wait_for_min_time(produce_to(), "sink", timeout_s=timeout_s)
    except TimeoutError as stuck:
        result.notes.append(str(stuck))
    finally:
        claimed = int(query.min_time("sink"))
        query.stop()
    return claimed
