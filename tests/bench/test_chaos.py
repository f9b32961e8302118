"""``lowtide bench chaos``: its ground truth flags exactly the premature notifications,
and a short run of every scenario finds none premature and none lost (on the tracker
before issue 21, a refused flush and a fake server were premature, a flipped log byte
and a front takeover lost the end)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lowtide.bench import chaos
from lowtide.bench.chaos.workload import Truth, Workload


def write_journal(tmp: Path, lines: list[str]) -> Truth:
    (tmp / "consumer.log").write_text("\n".join(lines) + "\n")
    return Truth.read(tmp)


def test_a_notification_past_an_item_still_in_flight_is_premature(tmp_path: Path) -> None:
    truth = write_journal(tmp_path, [
        "recv src 0 1000 100", "recv sink 0 1000 150",
        "recv src 1 1000 300", "recv sink 1 1000 320",
    ])
    # sink passed 1001 at 200, before front 1's item of slot 1000 left src (300)
    assert truth.premature([("sink", 1001, 200)]) == [
        "sink passed 1001 while front 1's slot 1000 was in flight in src"]
    # after everything was handed over for receipt: not premature
    assert truth.premature([("sink", 1001, 400), ("src", 1001, 300)]) == []
    # src's min time does not speak for sink's items
    assert truth.premature([("src", 1001, 310)]) == []
    assert truth.premature([(None, 1001, 310)]) != []


def test_a_retried_receipt_counts_from_its_first_attempt(tmp_path: Path) -> None:
    """The first journal line of an item is the lower bound of when its receipt was
    applied: a retry's later line must not make a timely notification premature."""
    truth = write_journal(tmp_path, [
        "recv src 0 1000 100", "recv sink 0 1000 150", "recv src 0 1000 900",
        "recv sink 0 1000 950",
    ])
    assert truth.premature([("sink", 1001, 200)]) == []
    # delays count from the latest attempt: the slot was done then
    assert truth.notify_delays_ms([("sink", 1001, 951_000_000 + 950)]) == pytest.approx([951.0])


def test_a_receipt_refused_as_behind_the_head_is_premature(tmp_path: Path) -> None:
    """Issue 29 point 2: when a producer's send-acks were lost, the tracker's min time
    passes records nobody read yet, and refuses their receipt: that is premature."""
    truth = write_journal(tmp_path, [
        "recv src 5 1012 100", "refused sink 5 12 AckBehindHead 101",
        "refused out 5 12 UnknownSegment 102",
    ])
    assert truth.premature([]) == [
        "the receipt of front 5's batch 12 was refused: a min time had passed it"]


#: the short run's scenarios by default (about 5 s each); the others run in the slow
#: tier, most with a faster test of their own (tests/service/)
# The scenarios whose figures the test reads, and the cheap ones; each other fault has
# tests of its own in tests/service and tests/spark/sources, and runs here in the slow
# test below.
DEFAULT_SCENARIOS = ("quiet", "kill -9 tracker", "log byte flipped", "dead front",
                     "slow batch", "first handshake cut")
WORK = Workload(slots=12, secret=b"chaos-secret-0123456789abcdef")


def short_run(names: list[str]) -> tuple[list[Any], dict[str, Any]]:
    """``names``' results and figures, each scenario run once: none premature or lost."""
    results = chaos.run(WORK, names)
    figures = chaos.summary(results)
    assert [r.name for r in results] == names
    assert figures["premature"] == 0 and figures["lost"] == 0, [
        (r.name, r.premature, r.notes) for r in results]
    assert figures["faults"] >= len(names)
    return results, figures


@pytest.mark.socket
def test_a_short_run_finds_nothing_premature_and_nothing_lost(capsys) -> None:  # type: ignore[no-untyped-def]
    names = [s.name for s in chaos.SCENARIOS if s.name in DEFAULT_SCENARIOS]
    assert len(names) == len(DEFAULT_SCENARIOS)
    results, figures = short_run(names)
    assert figures["scenarios"]["log byte flipped"]["refused_starts"] == 1
    # a front silent for good is retired by the policy (0 premature, the sink reaches
    # the end); batches 4x past --stuck-after-ms are never reported as losses
    assert figures["dead_front_retired"] and figures["false_loss_reports"] == 0, [
        (r.name, r.notes) for r in results if r.name in ("dead front", "slow batch")]
    assert figures["notify_p99_ms_quiet"] is not None
    chaos.print_table(results)
    json.dumps(figures)  # the JSON line the bench prints
    assert "kill -9 tracker" in capsys.readouterr().out


@pytest.mark.slow  # ~1.5 min: the short run's other scenarios
@pytest.mark.socket
def test_the_other_scenarios_find_nothing_premature_and_nothing_lost() -> None:
    names = [s.name for s in chaos.SCENARIOS
             if not s.standby and s.name not in DEFAULT_SCENARIOS]  # standby: the next test
    short_run(names)


@pytest.mark.slow  # ~30 s; failovers by default: tests/service/test_standby.py
@pytest.mark.socket
def test_a_leader_killed_or_partitioned_loses_nothing(kafka_broker) -> None:  # type: ignore[no-untyped-def]
    """Rule 18: a group's leader killed twice, and one paused until the standby led and
    then woken (it must exit fenced): nothing premature, nothing lost, a failover time."""
    names = [s.name for s in chaos.SCENARIOS if s.standby]
    assert names == ["leader killed", "leader partitioned"]
    work = Workload(slots=12, secret=b"chaos-secret-0123456789abcdef")
    results = chaos.run(work, names, bootstrap=kafka_broker.bootstrap)
    figures = chaos.summary(results)
    assert figures["premature"] == 0 and figures["lost"] == 0, [
        (r.name, r.premature, r.notes) for r in results]
    assert [len(r.failover_s) for r in results] == [2, 1], [r.notes for r in results]
    assert figures["failover_s"] is not None


@pytest.mark.spark
@pytest.mark.slow  # ~24 s; the same rerun by default: tests/spark/sinks/test_reruns.py
def test_a_spark_fault_kind_finds_nothing_premature_and_nothing_lost(spark, tmp_path: Path) -> None:
    """One of ``--spark``'s scenarios on the shared session: a Parquet table rerun from a
    new checkpoint (its rows were skipped, yet acked, before issue 29)."""
    from lowtide.bench.chaos.spark_faults import rerun, sinks

    result = rerun(spark, tmp_path, sinks()["write_table parquet"], "write_table parquet")
    figures = chaos.summary([result])
    assert (figures["faults"], figures["premature"], figures["lost"]) == (1, 0, 0), \
        result.premature


@pytest.mark.socket
@pytest.mark.slow
@pytest.mark.parametrize("phase", range(3))
def test_a_front_killed_in_each_phase_of_its_join_is_never_premature(phase: int) -> None:
    """"front killed mid-join" with each kill point (the short run draws one): before
    the front could register on the attached query's segment, while its join waits on
    the paused tracker, after it answered; 10-15 s each."""
    import functools

    from lowtide.bench.chaos import join_fault
    from lowtide.bench.chaos.run import Scenario

    kill = functools.partial(join_fault.kill_front_mid_join, phase=join_fault.PHASES[phase])
    scenario = Scenario("front killed mid-join", (kill,), producer="pause")
    work = Workload(slots=12, secret=b"chaos-secret-0123456789abcdef")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(chaos, "SCENARIOS", (scenario,))
        (result,) = chaos.run(work)
    assert (result.faults, result.premature, result.lost) == (1, [], 0), result.notes
    assert f"({join_fault.PHASES[phase]})" in result.notes[0]
