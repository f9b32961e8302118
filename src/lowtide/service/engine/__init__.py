"""The tracker's state behind a server: plain engines, no asyncio, no sockets.

A central engine (one core tracker), a shard's engine and a coordinator's engine, each
fed decoded requests and the clock by its server's state task (or a test), plus what
they share: dedup of requests and the front events a consumer must see.
"""
