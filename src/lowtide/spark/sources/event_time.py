"""Event time from any column: how ``Front(time_from=..., time_format=...)`` reads a
record's time, without changing the record (the producer writes what it was given).

``time_format``:

* None (default): by the column's type: timestamps as they are (without a zone: UTC),
  integers and floats as ms since the epoch, strings as ISO 8601 (``2026-11-26T08:15:00Z``,
  ``2026-11-26 08:15:00.250+01:00``; without an offset: UTC), dates at midnight UTC;
* ``"iso"``: ISO 8601 strings (or timestamps);
* ``"epoch_s"``, ``"epoch_ms"``, ``"epoch_us"``, ``"epoch_ns"``: numbers (or numeric
  strings) since the epoch in that unit, fractions kept to the ms;
* a pattern: Spark's (Java's) ``"yyyy-MM-dd HH:mm:ss"``, as ``F.to_timestamp(col,
  fmt)`` takes it, or Python's ``"%Y-%m-%d %H:%M:%S"`` (any ``%``); without a zone:
  UTC.

A format that cannot be read raises where the front is described (one line); a record
whose time does not fit its format raises in ``label``, before anything is labelled,
naming the column, the value and the format.

>>> import pandas as pd
>>> event_time("ts", "dd/MM/yyyy HH:mm").ms(pd.Series(["26/11/2026 08:15"])).tolist()
[1795680900000]
>>> event_time("ts", "epoch_s").ms(pd.Series([1.5])).tolist()
[1500]
>>> event_time("ts").ms(pd.Series(["1970-01-01T00:00:02.5+00:00"])).tolist()
[2500]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.core.errors import LowtideError

__all__ = ["BadEventTime", "EventTime", "event_time", "event_time_of"]

#: ms per unit of the epoch formats
EPOCHS = {"epoch_s": 1000.0, "epoch_ms": 1.0, "epoch_us": 1e-3, "epoch_ns": 1e-6}
# Java pattern letters (runs of them) and their strftime directives
_JAVA = {"yyyy": "%Y", "uuuu": "%Y", "yy": "%y", "MMMM": "%B", "MMM": "%b", "MM": "%m",
         "M": "%m", "dd": "%d", "d": "%d", "HH": "%H", "H": "%H", "hh": "%I", "h": "%I",
         "mm": "%M", "m": "%M", "ss": "%S", "s": "%S", "a": "%p", "EEEE": "%A", "EEE": "%a",
         "DDD": "%j", "XXX": "%z", "XX": "%z", "X": "%z", "xxx": "%z", "xx": "%z",
         "x": "%z", "Z": "%z", "ZZ": "%z", "ZZZ": "%z"}
_LETTERS = "y u M d H h m s S a E D X x Z"


class BadEventTime(LowtideError, ValueError):
    """A ``time_format`` lowtide cannot read, or a record whose time does not fit it."""


@dataclass(frozen=True)
class EventTime:
    """Where a front reads each record's event time: ``column``, read as ``form``
    (``"auto"``, ``"iso"``, an epoch unit, or ``"pattern"`` with ``strftime``)."""

    column: str
    form: str = "auto"
    strftime: str | None = None
    given: str | None = None  # the time_format as the user wrote it

    def ms(self, values: Any) -> npt.NDArray[np.int64]:
        """A pandas Series of the column's values as ms since the epoch."""
        import pandas as pd

        kind = str(values.dtype)
        if kind.startswith("datetime64") or (self.form == "auto" and kind == "object"
                                             and len(values) and not isinstance(
                                                 values.iloc[0], str)):
            return _timestamps_ms(pd.to_datetime(values, utc=True))
        if self.form in EPOCHS or (self.form == "auto" and kind != "object"):
            return self._epoch_ms(values)
        return self._parsed_ms(values)

    def _epoch_ms(self, values: Any) -> npt.NDArray[np.int64]:
        import pandas as pd

        scale = EPOCHS.get(self.form, 1.0)
        if values.dtype.kind in "iu":  # exact, no float on the way
            ints = np.asarray(values, np.int64)
            return ints * int(scale) if scale >= 1 else ints // round(1 / scale)
        numbers = pd.to_numeric(values, errors="coerce")
        self._refuse(values, numbers.isna())
        as_ms = np.floor(np.round(np.asarray(numbers, np.float64) * scale, 3))
        return as_ms.astype(np.int64)

    def _parsed_ms(self, values: Any) -> npt.NDArray[np.int64]:
        import pandas as pd

        fmt = self.strftime or "ISO8601"
        try:
            parsed = pd.to_datetime(values, format=fmt, utc=True)
        except (ValueError, TypeError):  # name the first value that does not fit
            self._refuse(values, pd.to_datetime(values, format=fmt, utc=True,
                                                errors="coerce").isna())
            raise
        return _timestamps_ms(parsed)

    def _refuse(self, values: Any, bad: Any) -> None:
        if bool(np.asarray(bad).any()):
            first = values[np.asarray(bad)].iloc[0]
            how = f"time_format={self.given!r}" if self.given else \
                "the default (ISO 8601 strings, ms numbers, timestamps)"
            raise BadEventTime(f"time_from={self.column!r}: {first!r} does not fit {how}: "
                               "pass the column's time_format (e.g. 'yyyy-MM-dd HH:mm:ss', "
                               "'epoch_s')")


def _timestamps_ms(ts: Any) -> npt.NDArray[np.int64]:
    """UTC pandas timestamps as ms since the epoch (floor)."""
    ns = np.asarray(ts.astype("datetime64[ns, UTC]").astype("int64"), np.int64)
    return ns // 1_000_000


def event_time(column: str, time_format: str | None = None) -> EventTime:
    """The :class:`EventTime` of ``time_from=column, time_format=...``; a format it
    cannot read raises :class:`BadEventTime` here, in one line."""
    if not isinstance(column, str) or not column:
        raise BadEventTime(f"time_from={column!r}: give the name of the column with the "
                           "records' event time")
    if time_format is None:
        return EventTime(column)
    fmt = str(time_format)
    if fmt.lower() == "iso":
        return EventTime(column, "iso", None, fmt)
    if fmt.lower() in EPOCHS:
        return EventTime(column, fmt.lower(), None, fmt)
    if "%" in fmt:
        return EventTime(column, "pattern", fmt, fmt)
    return EventTime(column, "pattern", java_pattern(fmt), fmt)


def event_time_of(time_from: str | None, time_format: str | None) -> EventTime | None:
    """A front's ``time_from`` and ``time_format`` (None: the front's clock)."""
    if time_from is None:
        if time_format is not None:
            raise BadEventTime(f"time_format={time_format!r} needs time_from= (the column "
                               "with the records' event time)")
        return None
    return event_time(time_from, time_format)


def java_pattern(fmt: str) -> str:
    """A Spark (Java) datetime pattern as a strftime pattern; ``'quoted'`` text is
    literal; an unsupported letter raises :class:`BadEventTime`."""
    out, i = [], 0
    while i < len(fmt):
        c = fmt[i]
        if c == "'":  # quoted text, '' a quote in it or alone
            end, text = i + 1, []
            while True:
                close = fmt.find("'", end)
                if close < 0:
                    raise BadEventTime(f"time_format={fmt!r}: a quote is not closed")
                text.append(fmt[end:close])
                if fmt[close + 1:close + 2] != "'":
                    break
                text.append("'")
                end = close + 2
            out.append("".join(text).replace("%", "%%") if close > i + 1 else "'")
            i = close + 1
            continue
        run = re.match(rf"{re.escape(c)}+", fmt[i:]).group(0)  # type: ignore[union-attr]
        i += len(run)
        if not c.isalpha():
            out.append(run.replace("%", "%%"))
        elif c == "S":
            out.append("%f")
        elif run in _JAVA:
            out.append(_JAVA[run])
        else:
            raise BadEventTime(f"time_format={fmt!r}: {run!r} is not a pattern lowtide reads "
                               f"(letters: {_LETTERS}; or a strftime pattern with %)")
    return "".join(out)
