"""Pure state machines: no I/O, no asyncio, no pyspark, no clock reads."""
