"""The fault kind "retry loop under task failures and a restart" (``lowtide bench chaos
--spark``): two fronts write an ingest log; a query's step, after a tracked
``repartition`` (a hash of the tracking column), fails some records once or twice and
some always (``map(..., retry=RetryPolicy(attempts=3))``); one task of the step fails
after its acks went out (Spark runs it again, reading the shuffle again), and the
query is stopped while rows wait in the loop and restarted from its checkpoint. Ground
truth: every record the fronts logged, and which of them the step gives up.

* ``premature``: the sink's min time announced while a logged record below it, not
  given up, was not in the output (sampled while it runs, and at the end), or a row
  written twice, or a dead letter twice;
* ``lost``: logged records neither in the output nor in the dead letters at the end,
  and records given up that are missing from the dead letters.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lowtide
from lowtide.bench.chaos.replay_fault import TRIGGER, _logged, _rows, send_rounds
from lowtide.bench.chaos.run import Result
from lowtide.bench.chaos.task_failures import fail_first_task
from lowtide.spark import Pipeline

ATTEMPTS = 3
RETRY_LOOP = "retry loop under task failures and a restart"


def attempts_needed(front: Any, offset: Any) -> Any:
    """Per record (numpy arrays): 1, 2 or 3 attempts, or never (99) for every 9th."""
    import numpy as np

    need = np.ones(len(offset), np.int64)
    need[offset % 4 == 1] = 2
    need[offset % 6 == 2] = 3
    need[(offset + front) % 9 == 0] = 99
    return need


def flaky(batch: Any) -> Any:
    """The step: a record fails while its attempt is below what it needs."""
    import numpy as np
    import pyarrow as pa

    front, offset = batch["front"].to_numpy(), batch["offset"].to_numpy()
    failed = batch["lt_attempt"].to_numpy() + 1 < attempts_needed(front, offset)
    error = pa.array(np.where(failed, "unavailable", None).tolist(), pa.string())
    return pa.record_batch({"front": batch["front"], "offset": batch["offset"],
                            "error": error})


@dataclass
class LoopRun:
    logged: dict[tuple[int, int], int] = field(default_factory=dict)  # (front, offset) -> slot
    written: list[tuple[int, int]] = field(default_factory=list)
    dead: list[tuple[int, int]] = field(default_factory=list)
    early: list[str] = field(default_factory=list)  # premature announcements seen
    waiting_at_restart: int = 0
    claimed: int = 0  # the sink's min time at the end


def given_up(logged: dict[tuple[int, int], int]) -> set[tuple[int, int]]:
    import numpy as np

    keys = sorted(logged)
    if not keys:
        return set()
    front, offset = (np.array(c, np.int64) for c in zip(*keys, strict=True))
    need = attempts_needed(front, offset)
    return {k for k, n in zip(keys, need.tolist(), strict=True) if n > ATTEMPTS}


def retry_loop_run(spark: Any, tmp: Path, timeout_s: float = 300.0) -> LoopRun:
    ingest, out, run = tmp / "ingest", tmp / "out", LoopRun()
    policy = lowtide.RetryPolicy(attempts=ATTEMPTS, path=str(tmp / "retries"))
    pipe = Pipeline(spark, "chaos-retry")
    stream = (pipe.read_log(str(ingest), fronts=[0, 1]).repartition(2)
              .map(flaky, "front int, offset long", name="step", retry=policy)
              .transform(lambda d: d.mapInArrow(fail_first_task(str(tmp / "failed")),
                                                d.schema)))

    def start() -> Any:
        return stream.write_parquet(str(out), checkpoint=str(tmp / "ckpt"), trigger=TRIGGER,
                                    keep_tracking_columns=True)

    try:
        pipe.start_tracker(stream.graph())
        fronts = [pipe.front(f, fsync="never") for f in (0, 1)]
        query = start()
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(pipe, tmp, run, stop), daemon=True)
        sampler.start()
        try:
            final = send_rounds(fronts, rounds=12)
            deadline = time.monotonic() + timeout_s
            while policy.status().waiting_rows == 0 and time.monotonic() < deadline:
                time.sleep(0.1)  # the first failed rows on their way round
            run.waiting_at_restart = policy.status().waiting_rows
            query.stop()  # with rows in the loop
            query = start()
            run.claimed = query.wait_for_min_time(final, timeout_s=timeout_s)
        finally:
            stop.set()
            sampler.join()
    finally:
        pipe.close()
    run.logged, run.written = _logged(ingest), _rows(out)
    run.dead = _rows(Path(policy.dead_letter_path), "*.parquet")
    return run


def _sample(pipe: Any, tmp: Path, run: LoopRun, stop: threading.Event) -> None:
    """Every 0.3 s: the sink's min time, then the output then: a logged record below
    it, not given up, missing from the output is premature."""
    while not stop.wait(0.3):
        try:
            claimed = _sink_min_time(pipe.tracker.status())
            have = set(_rows(tmp / "out"))
            logged = _logged(tmp / "ingest")
        except Exception:  # the pipeline closing under it, a file being written
            continue
        dead = given_up(logged)
        early = [k for k, t in logged.items() if t < claimed and k not in have
                 and k not in dead]
        if early:
            run.early.append(f"min time {claimed}: {len(early)} records below it not "
                             "in the output")


def _sink_min_time(status: dict[str, Any]) -> int:
    return int(next(d["min_time"] for d in status["segments"] if d["segment"] == "sink"))


def result_of(run: LoopRun) -> Result:
    result = Result(RETRY_LOOP, faults=2)
    result.premature += run.early[:3]
    have, dead, should = set(run.written), set(run.dead), given_up(run.logged)
    early = [k for k, t in run.logged.items() if t < run.claimed and k not in have
             and k not in should]
    if early:
        result.premature.append(f"min time {run.claimed} announced at the end, {len(early)} "
                                "records below it neither out nor given up")
    if len(run.written) != len(have) or len(run.dead) != len(dead):
        result.premature.append(f"{len(run.written) - len(have)} rows written twice, "
                                f"{len(run.dead) - len(dead)} dead letters twice")
    result.lost = len(set(run.logged) - have - dead) + len(should - dead)
    result.notes.append(f"{len(have)} rows out, {len(dead)} given up (expected "
                        f"{len(should)}), {run.waiting_at_restart} waiting at the restart")
    return result


__all__ = ["RETRY_LOOP", "LoopRun", "result_of", "retry_loop_run"]
