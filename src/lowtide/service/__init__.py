"""The tracker as a service: server, agent, subscriptions, persistence, auth, metrics.

>>> from lowtide.service import TrackerService, Agent, BatchKey  # the Spark layer's API

Names load on first use: a Spark task that only needs an agent does not import the
server (about half of a Python worker's import time).
"""

from typing import TYPE_CHECKING

from lowtide import lazy_exports

if TYPE_CHECKING:
    from lowtide.service.auth import load_secret
    from lowtide.service.client.agent import Agent
    from lowtide.service.client.agent_state import AgentConfig
    from lowtide.service.client.batches import BatchKey, PendingBatch
    from lowtide.service.client.caller import CallerAgent
    from lowtide.service.client.subscription import AsyncSubscription, Subscription
    from lowtide.service.clock import wall_ms
    from lowtide.service.deploy.embedded import TrackerService
    from lowtide.service.errors import ConnectionLost, ServiceError, SessionFailed
    from lowtide.service.server.config import ServerConfig
    from lowtide.service.server.tracker_server import TrackerServer

__all__ = [
    "Agent",
    "AgentConfig",
    "AsyncSubscription",
    "BatchKey",
    "CallerAgent",
    "ConnectionLost",
    "PendingBatch",
    "ServerConfig",
    "ServiceError",
    "SessionFailed",
    "Subscription",
    "TrackerServer",
    "TrackerService",
    "load_secret",
    "wall_ms",
]

__getattr__ = lazy_exports(__name__, {
    "load_secret": "lowtide.service.auth",
    "Agent": "lowtide.service.client.agent",
    "AgentConfig": "lowtide.service.client.agent_state",
    "BatchKey": "lowtide.service.client.batches",
    "PendingBatch": "lowtide.service.client.batches",
    "CallerAgent": "lowtide.service.client.caller",
    "AsyncSubscription": "lowtide.service.client.subscription",
    "Subscription": "lowtide.service.client.subscription",
    "wall_ms": "lowtide.service.clock",
    "TrackerService": "lowtide.service.deploy.embedded",
    "ConnectionLost": "lowtide.service.errors",
    "ServiceError": "lowtide.service.errors",
    "SessionFailed": "lowtide.service.errors",
    "ServerConfig": "lowtide.service.server.config",
    "TrackerServer": "lowtide.service.server.tracker_server",
})
