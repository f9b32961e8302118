"""The client side: agents (one per process), their connections to a tracker, keyed
batches, subscriptions, and the status poller of ``lowtide status``."""
