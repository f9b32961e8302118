"""The tracker server (asyncio): one task owns the engine, connections feed it.

Its config, the state task's inbox, the connections (admission, handshakes, reading),
standing requests (subscriptions, MinTimeAt questions) and their subscribers, the
min-time history, metrics, and a coordinator's connections to its shards.
"""
