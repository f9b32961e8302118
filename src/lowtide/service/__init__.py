"""The tracker as a service: server, agent, subscriptions, persistence, auth, metrics.

>>> from lowtide.service import TrackerService, Agent, BatchKey  # the Spark layer's API
"""

from lowtide.service.agent import Agent, AgentConfig
from lowtide.service.auth import load_secret
from lowtide.service.batches import BatchKey, PendingBatch
from lowtide.service.caller import CallerAgent
from lowtide.service.clock import wall_ms
from lowtide.service.config import ServerConfig
from lowtide.service.embedded import TrackerService
from lowtide.service.errors import ConnectionLost, ServiceError, SessionFailed
from lowtide.service.server import TrackerServer
from lowtide.service.subscribe import AsyncSubscription, Subscription

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
