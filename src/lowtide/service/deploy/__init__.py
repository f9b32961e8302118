"""Ways to run a tracker: embedded in the driver, standalone (``lowtide serve``), and
as shard processes under a coordinator."""
