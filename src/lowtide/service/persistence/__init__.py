"""A tracker's state dir: the write-ahead log, snapshots, and exact recovery."""
