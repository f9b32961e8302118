"""The tracker as a service: server, agent, subscriptions, persistence, auth, metrics.

>>> from lowtide.service import TrackerService, Agent, BatchKey  # the Spark layer's API
"""

from lowtide.service.agent import Agent, AgentConfig, BatchKey, CallerAgent, PendingBatch
from lowtide.service.embedded import TrackerService
from lowtide.service.errors import ConnectionLost, ServiceError
from lowtide.service.server import ServerConfig, TrackerServer
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
    "Subscription",
    "TrackerServer",
    "TrackerService",
]
