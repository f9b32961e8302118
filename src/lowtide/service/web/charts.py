"""The web view's charts: each segment's min time and lag over the last hour, kept by
the server in a bounded ring of buckets (one per ``bucket_ms`` of wall time, at most
``span_ms / bucket_ms`` of them: 720 for an hour of 5 s), each holding per segment
the bucket's latest min time and its worst (largest) lag. A status refresh updates
the newest bucket in place, so memory and the document stay the same size however
long the tracker runs.

>>> ring = ChartRing(span_ms=30_000, bucket_ms=10_000)
>>> for now, lag in ((1_000, 50), (4_000, 900), (12_000, 70)):
...     ring.record(now, [{"name": "sink", "min_time_ms": now - lag, "lag_ms": lag}])
>>> doc = ring.document()
>>> doc["t_ms"], doc["series"][0]["lag_ms"], doc["series"][0]["min_time_ms"]
([0, 10000], [900, 70], [3100, 11930])
>>> for now in range(20_000, 60_000, 10_000):
...     ring.record(now, [{"name": "sink", "min_time_ms": now, "lag_ms": 0}])
>>> ring.document()["t_ms"]  # the last 30 s only
[30000, 40000, 50000]
"""

from __future__ import annotations

from collections import deque
from typing import Any

HOUR_MS = 3_600_000
BUCKET_MS = 5_000

#: per segment name: [latest min time (UTC ms), worst lag (ms)], either None (unknown)
Bucket = dict[str, list[int | None]]


def _worst(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


class ChartRing:
    def __init__(self, span_ms: int = HOUR_MS, bucket_ms: int = BUCKET_MS) -> None:
        self.bucket_ms = bucket_ms
        self._buckets: deque[tuple[int, Bucket]] = deque(maxlen=max(1, span_ms // bucket_ms))

    def record(self, now_ms: int, segments: list[dict[str, Any]]) -> None:
        """One refresh: ``segments`` as the view document has them (``name``,
        ``min_time_ms``, ``lag_ms``; no lag: no min time yet, or the input ended,
        and no point)."""
        start = now_ms // self.bucket_ms * self.bucket_ms
        if not self._buckets or self._buckets[-1][0] < start:
            self._buckets.append((start, {}))
        bucket = self._buckets[-1][1]
        for seg in segments:
            old = bucket.get(seg["name"], [None, None])
            if seg["lag_ms"] is not None:
                bucket[seg["name"]] = [seg["min_time_ms"], _worst(old[1], seg["lag_ms"])]
            else:
                bucket[seg["name"]] = old

    def document(self) -> dict[str, Any]:
        """Per segment (those of the newest bucket), a point per bucket: ``t_ms``
        the buckets' starts, None where a segment had no figure."""
        names = list(self._buckets[-1][1]) if self._buckets else []
        return {
            "bucket_ms": self.bucket_ms,
            "t_ms": [start for start, _b in self._buckets],
            "series": [
                {"segment": name,
                 "min_time_ms": [b.get(name, [None, None])[0] for _s, b in self._buckets],
                 "lag_ms": [b.get(name, [None, None])[1] for _s, b in self._buckets]}
                for name in names
            ],
        }
