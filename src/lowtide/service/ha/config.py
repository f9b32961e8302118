"""Where a tracker group keeps its replicated step log: ``kafka://HOST:PORT/GROUP``.

>>> cfg = HaConfig.parse("kafka://127.0.0.1:9092,127.0.0.1:9093/orders")
>>> cfg.bootstrap, cfg.topic, cfg.transactional_id
('127.0.0.1:9092,127.0.0.1:9093', 'lowtide-orders', 'lowtide-orders')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GROUP = re.compile(r"[A-Za-z0-9._-]{1,200}")


@dataclass(frozen=True)
class HaConfig:
    """``bootstrap``: the brokers; ``group``: the tracker group's name (its topic and its
    transactional id: two trackers of one group fence each other); ``lease_ms``: a
    leader silent this long is taken over (it heartbeats every quarter of it)."""

    bootstrap: str
    group: str
    lease_ms: int = 3_000
    #: librdkafka settings added to the producer's and consumer's (security, say)
    client: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not GROUP.fullmatch(self.group):
            raise ValueError(f"a tracker group is letters, digits, '.', '_' or '-', got "
                             f"{self.group!r}: --ha kafka://HOST:PORT/GROUP")
        if self.lease_ms < 200:
            raise ValueError(f"--lease-s must be at least 0.2 s, got {self.lease_ms / 1000}")

    @classmethod
    def parse(cls, url: str, lease_ms: int = 3_000) -> HaConfig:
        """``kafka://HOST:PORT[,HOST:PORT...]/GROUP``; a ValueError says the form."""
        scheme, sep, rest = url.partition("://")
        brokers, _, group = rest.partition("/")
        if scheme != "kafka" or not sep or not brokers or not group:
            raise ValueError(f"--ha must be kafka://HOST:PORT/GROUP, got {url!r}")
        return cls(brokers, group, lease_ms)

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}/{self.group}"

    @property
    def topic(self) -> str:
        return f"lowtide-{self.group}"

    @property
    def transactional_id(self) -> str:
        return f"lowtide-{self.group}"

    @property
    def beat_ms(self) -> int:
        return self.lease_ms // 4

    def settings(self, **extra: object) -> dict[str, object]:
        return {"bootstrap.servers": self.bootstrap, **dict(self.client), **extra}
