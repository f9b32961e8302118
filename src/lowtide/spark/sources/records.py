"""The kinds of record batch a front labels, handled alike: a list of ``bytes``, a
pyarrow ``Table`` or ``RecordBatch``, or a pandas ``DataFrame``. No pyspark; pyarrow
and pandas are imported only when such a batch is given.

* :func:`count` -- how many records;
* :func:`event_times_ms` -- a column of event times as int64 milliseconds (how the
  column is read: :mod:`~lowtide.spark.sources.event_time`);
* :func:`take` -- the records at some positions, same kind;
* :func:`with_labels` -- the batch with int64 columns ``lt_time`` and ``lt_ack`` set
  (replaced if present); a list of bytes has no columns and comes back unchanged (its
  labels travel beside it: Kafka headers, or the ingest log's own fields).

>>> import numpy as np, pyarrow as pa
>>> t = pa.table({"ts": pa.array([1_000, 2_500], pa.timestamp("ms")), "v": [1, 2]})
>>> count(t), event_times_ms(t, "ts").tolist()
(2, [1000, 2500])
>>> with_labels(t, np.array([100, 250]), np.array([7, -1])).column_names
['ts', 'v', 'lt_time', 'lt_ack']
>>> take([b"a", b"b", b"c"], np.array([0, 2]))
[b'a', b'c']
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.spark.sources.event_time import EventTime, event_time
from lowtide.spark.sources.labels import ACK_COLUMN, TIME_COLUMN

__all__ = ["count", "event_times_ms", "json_lines", "kind", "take", "with_labels"]

KINDS = ("bytes", "arrow", "pandas")


def kind(records: Any) -> str:
    """``"bytes"``, ``"arrow"`` or ``"pandas"``; anything else is a TypeError."""
    if isinstance(records, list | tuple):
        if all(isinstance(r, bytes | bytearray | memoryview) for r in records):
            return "bytes"
    elif hasattr(records, "schema") and hasattr(records, "column"):
        return "arrow"
    elif hasattr(records, "iloc") and hasattr(records, "columns"):
        return "pandas"
    raise TypeError("a front labels a list of bytes, a pyarrow Table/RecordBatch or a "
                    f"pandas DataFrame, not {type(records).__name__}")


def count(records: Any) -> int:
    kind(records)
    return len(records) if not hasattr(records, "num_rows") else int(records.num_rows)


def event_times_ms(records: Any, time: str | EventTime) -> npt.NDArray[np.int64]:
    """The event times of a table or DataFrame as int64 milliseconds since the epoch:
    ``time`` a column name (read by its type) or an :class:`EventTime`."""
    spec = time if isinstance(time, EventTime) else event_time(time)
    column = spec.column
    k = kind(records)
    if k == "bytes":
        raise TypeError(f"time_from={column!r} needs records with columns (a pyarrow "
                        "table or a pandas DataFrame), not a list of bytes")
    names = records.column_names if k == "arrow" else list(records.columns)
    if column not in names:
        raise KeyError(f"time_from={column!r}: no such column (columns: {names})")
    values = records.column(column).to_pandas() if k == "arrow" else records[column]
    if values.isna().any():
        raise ValueError(f"time_from={column!r}: {int(values.isna().sum())} records have "
                         "no time")
    return spec.ms(values.reset_index(drop=True))


def take(records: Any, positions: npt.NDArray[np.int64]) -> Any:
    """The records at ``positions``, as the same kind of batch."""
    k = kind(records)
    if k == "bytes":
        return [records[int(i)] for i in positions]
    if k == "arrow":
        return records.take(positions)
    return records.iloc[positions].reset_index(drop=True)


def with_labels(
    records: Any, times: npt.NDArray[np.int64], acks: npt.NDArray[np.int64]
) -> Any:
    """The batch with the label columns set (a list of bytes is returned as is)."""
    k = kind(records)
    if k == "bytes":
        return records
    if k == "pandas":
        out = records.copy()
        out[TIME_COLUMN] = np.asarray(times, np.int64)
        out[ACK_COLUMN] = np.asarray(acks, np.int64)
        return out
    import pyarrow as pa

    for name, values in ((TIME_COLUMN, times), (ACK_COLUMN, acks)):
        column = pa.array(np.asarray(values, np.int64), pa.int64())
        if name in records.column_names:
            records = records.set_column(records.column_names.index(name), name, column)
        else:
            records = records.append_column(name, column)
    return records


def json_lines(records: Any) -> list[str]:
    """The rows of a table or DataFrame as JSON objects (timestamps in ISO 8601 with
    milliseconds; int64 exact)."""
    if kind(records) == "bytes":
        raise TypeError("JSON rows need columns: pass a table or a DataFrame")
    frame = records.to_pandas() if kind(records) == "arrow" else records
    text: str = frame.to_json(orient="records", lines=True, date_format="iso", date_unit="ms")
    return text.splitlines()
