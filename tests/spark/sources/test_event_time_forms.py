"""Event time from any column (``Front(time_from=, time_format=)``): each accepted form
read to the same ms, the record the producer writes left as it was given, a format
lowtide cannot read refused where the front is described and a value that does not fit
refused in ``label`` before anything is labelled, each in one line."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from lowtide.core.time import ManualClock
from lowtide.spark.sources.event_time import BadEventTime, event_time, java_pattern
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.records import event_times_ms, json_lines
from tests.spark.helpers import CoreAgent
from tests.spark.sources.helpers import GRAPH, GRID, T0

MS = 1_795_680_900_250  # 2026-11-26 08:15:00.250 UTC


@pytest.mark.parametrize(("values", "time_format", "expected"), [
    (["2026-11-26T08:15:00.250Z"], None, MS),  # ISO 8601 strings: the default
    (["2026-11-26 09:15:00.25+01:00"], None, MS),
    (["2026-11-26T08:15:00.250"], "iso", MS),  # no offset: UTC
    ([MS], None, MS),  # integers: ms
    ([MS], "epoch_ms", MS),
    ([MS / 1000], "epoch_s", MS),
    ([MS // 1000], "epoch_s", MS - 250),  # integers in seconds: exact
    ([MS * 1000], "epoch_us", MS),
    ([MS * 1_000_000], "epoch_ns", MS),
    ([str(MS * 1000)], "epoch_us", MS),  # numeric strings
    (["26/11/2026 08:15:00.250"], "dd/MM/yyyy HH:mm:ss.SSS", MS),  # Spark's patterns
    (["2026-11-26T08:15:00.250+0000"], "yyyy-MM-dd'T'HH:mm:ss.SSSZ", MS),
    (["Thu, 26 Nov 2026 08:15:00.25"], "EEE, dd MMM yyyy HH:mm:ss.SS", MS),
    (["20261126 081500.250"], "%Y%m%d %H%M%S.%f", MS),  # strftime
    ([pd.Timestamp(MS, unit="ms")], None, MS),  # timestamps: as they are
    ([pd.Timestamp(MS, unit="ms", tz="Europe/Paris")], "yyyy", MS),
])
def test_each_form_reads_the_same_time(values: list, time_format: str | None,
                                       expected: int) -> None:
    frame = pd.DataFrame({"ts": values})
    assert event_times_ms(frame, event_time("ts", time_format)).tolist() == [expected]
    table = pa.Table.from_pandas(frame)
    assert event_times_ms(table, event_time("ts", time_format)).tolist() == [expected]


def test_an_epoch_in_seconds_keeps_its_fraction_to_the_ms() -> None:
    frame = pd.DataFrame({"ts": [1.0005, 1764000000.123, -0.5]})
    assert event_times_ms(frame, event_time("ts", "EPOCH_S")).tolist() == [
        1000, 1_764_000_000_123, -500]


def test_java_patterns_become_strftime_and_quotes_stay_literal() -> None:
    assert java_pattern("yyyy-MM-dd'T'HH:mm:ss.SSSXXX") == "%Y-%m-%dT%H:%M:%S.%f%z"
    assert java_pattern("hh 'o''clock' a, 100%") == "%I o'clock %p, 100%%"
    assert java_pattern("''yy") == "'%y"


def front(**kwargs: object) -> Front:
    return Front(None, 9, CoreAgent(GRAPH, GRID), grid=GRID, clock=ManualClock(0),
                 heartbeat_ms=None, time_from="ts", **kwargs)


def test_a_front_labels_iso_strings_without_changing_the_record() -> None:
    """It failed with "invalid literal for int()" before; converting the column first
    rewrote what the producer writes."""
    records = pd.DataFrame({"ts": ["1970-01-01T00:16:40.250Z", "1970-01-01T00:16:41Z"],
                            "v": [1, 2]})  # T0 + 250 ms, T0 + 1 s
    batch = front().label(records)
    assert batch.times.tolist() == [(T0 + 250) // 10, (T0 + 1000) // 10]
    assert batch.records["ts"].tolist() == records["ts"].tolist()  # the producer's strings
    assert json_lines(batch.records)[0].startswith('{"ts":"1970-01-01T00:16:40.250Z","v":1,')
    assert records.columns.tolist() == ["ts", "v"]  # the caller's frame untouched


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"time_format": "yyyy-ww"}, r"^time_format='yyyy-ww': 'ww' is not a pattern lowtide "),
    ({"time_format": "yyyy 'T"}, r"^time_format=\"yyyy 'T\": a quote is not closed"),
    ({"time_from": ""}, r"^time_from='': give the name of the column"),
    ({"time_from": None, "time_format": "iso"}, r"^time_format='iso' needs time_from="),
])
def test_a_format_lowtide_cannot_read_is_refused_where_the_front_is_described(
        kwargs: dict, message: str) -> None:
    args = {"time_from": "ts", **kwargs}
    with pytest.raises(BadEventTime, match=message) as err:
        Front(None, 9, CoreAgent(GRAPH, GRID), grid=GRID, clock=ManualClock(0),
              heartbeat_ms=None, **args)
    assert "\n" not in str(err.value) and isinstance(err.value, ValueError)


@pytest.mark.parametrize(("values", "time_format", "shown"), [
    (["2026-11-26T08:15:00Z", "26/11/2026"], None, "'26/11/2026' does not fit the default"),
    (["26/11/2026", "2026-11-26"], "dd/MM/yyyy", "'2026-11-26' does not fit time_format="),
    (["1764000000", "soon"], "epoch_s", "'soon' does not fit time_format='epoch_s'"),
])
def test_a_value_that_does_not_fit_labels_nothing(values: list, time_format: str | None,
                                                  shown: str) -> None:
    f = front(time_format=time_format)
    with pytest.raises(BadEventTime, match=shown) as err:
        f.label(pd.DataFrame({"ts": values}))
    assert "\n" not in str(err.value) and "pass the column's time_format" in str(err.value)
    assert f.status()["labelled"] == 0 and not f.registered
