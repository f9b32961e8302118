"""The label contract between a front (the producer side) and a tracked entry (the
consumer side). No pyspark, no I/O: both sides import it.

Every record a front hands back for writing carries two labels:

``lt_time`` (int64)
    the record's global time slot on the pipeline's ``TimeGrid``: ``clock_ms //
    delta_ms`` of the front's clock (or of the record's own event time with
    ``time_from``), never below the front's previous heartbeat.
``lt_ack`` (int64)
    the record's 64-bit root ack ``lowtide.core.acks.root_acks(front, seq)`` viewed
    as a signed int64 (Spark has no unsigned longs): ``as_label(acks)`` /
    ``from_label(labels)``.

Order at the front: the send-acks (``+1`` per record, XOR of ``lt_ack``, into the
consumer's ingest segment at ``lt_time``; one copy per consumer segment when several
consumers read the input) are handed to the tracker before the record is handed back
for writing; the front heartbeats past a record's ``lt_time`` only after the write was
confirmed (a Kafka delivery report, a renamed file). A consumer acknowledges receipt
by XOR-ing ``lt_ack`` into ``lt_time`` of *its* ingest segment with count ``-1``,
exactly once per record (across task retries and restarts).

Where the labels travel:

* Kafka: as record **headers** ``lt_time`` and ``lt_ack``, each the ASCII decimal of
  the signed int64 (e.g. ``b"-6917529027641081856"``), and ``lt_front``, the id of
  the front that labelled it (so a query attached to a topic while its producers run
  can keep each front's records from where that front joined it; records of older
  producers lack it: they belong to the fronts a query was started with). Headers
  leave any payload alone (bytes, JSON, Avro). Spark's Kafka source reads them with
  ``.option("includeHeaders", "true")`` and the expressions :data:`KAFKA_HEADER_EXPRS`
  (``CAST(CAST(value AS STRING) AS BIGINT)``; a missing header is null). When the
  records are table rows, the producer writes each row as a JSON object that carries
  ``lt_time`` and ``lt_ack`` as fields too, so ``from_json`` on the value is an
  equivalent way in.
* Files (JSON lines, Parquet): as int64 **columns** ``lt_time`` and ``lt_ack``.

>>> import numpy as np
>>> acks = np.array([1, 2**63, 2**64 - 1], np.uint64)
>>> as_label(acks).tolist()
[1, -9223372036854775808, -1]
>>> bool((from_label(as_label(acks)) == acks).all())
True
>>> header_value(-5), parse_header(b"-5")
(b'-5', -5)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "ACK_COLUMN",
    "FRONT_COLUMN",
    "KAFKA_HEADER_EXPRS",
    "LABEL_COLUMNS",
    "TIME_COLUMN",
    "as_label",
    "from_label",
    "header_value",
    "parse_header",
]

TIME_COLUMN = "lt_time"
ACK_COLUMN = "lt_ack"
LABEL_COLUMNS = (TIME_COLUMN, ACK_COLUMN)
FRONT_COLUMN = "lt_front"


def _header_expr(name: str) -> str:
    return (f"CAST(CAST(element_at(filter(headers, h -> h.key = '{name}'), 1).value "
            f"AS STRING) AS BIGINT)")


#: Spark SQL expressions that turn the Kafka source's ``headers`` column (with
#: ``includeHeaders``) into the label columns and ``lt_front``: ``df.selectExpr("*",
#: *(f"{e} AS {c}" for c, e in KAFKA_HEADER_EXPRS.items()))``.
KAFKA_HEADER_EXPRS = {name: _header_expr(name) for name in (*LABEL_COLUMNS, FRONT_COLUMN)}


def as_label(acks: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """Root acks as the int64 ``lt_ack`` column (same bits)."""
    return np.asarray(acks, np.uint64).view(np.int64)


def from_label(labels: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """The ``lt_ack`` column back to ack values (same bits)."""
    return np.asarray(labels, np.int64).view(np.uint64)


def header_value(label: int) -> bytes:
    """A label as a Kafka header value."""
    return str(int(label)).encode("ascii")


def parse_header(value: bytes) -> int:
    """A Kafka header value back to the label."""
    return int(value.decode("ascii"))


@dataclass(frozen=True)
class Labelled:
    """One labelled batch: ``records`` to write (label columns attached to tables), the
    labels, and what the late policy returned to the producer (``late="reject"``)."""

    records: Any
    times: npt.NDArray[np.int64]
    acks: npt.NDArray[np.int64]
    first_seq: int
    rejected: Any = None
    token: int = 0

    def __len__(self) -> int:
        return len(self.times)
