"""The tracker as a service: server, agent, subscriptions, persistence, auth, metrics.

>>> from lowtide.service import TrackerService, Agent, BatchKey  # the Spark layer's API
"""

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
