"""The client: PolicyClient with RLlib's verbs, remote or local inference, uploads and vector envs.

Importing this imports neither torch nor Flask.
"""

from pipeline.client.policy_client import PolicyClient
from pipeline.client.transport import base_url
from pipeline.client.vector import VectorEpisodes
from pipeline.errors import (
    EpisodeError,
    RequestRejected,
    ServerError,
    ServerUnavailable,
    Unauthorized,
)

__all__ = [
    "EpisodeError",
    "PolicyClient",
    "RequestRejected",
    "ServerError",
    "ServerUnavailable",
    "Unauthorized",
    "VectorEpisodes",
    "base_url",
]
