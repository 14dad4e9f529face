"""Every Redis key name of the global queue, built in one place.

All keys of one namespace share a Redis Cluster hash tag (``{namespace}``), so each Lua step touches a
single slot; a fleet shards by giving each model or pool its own namespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class QueueKeys:
    """Key names for one namespace (one global queue)."""

    namespace: str = "default"
    root: str = "fg"

    def __post_init__(self) -> None:
        if not _NAMESPACE.match(self.namespace):
            raise ValueError(f"namespace must match {_NAMESPACE.pattern}, got {self.namespace!r}")

    @property
    def prefix(self) -> str:
        """Prefix the Lua scripts build their keys from."""
        return f"{self.root}:{{{self.namespace}}}:"

    @property
    def meta(self) -> str:
        """The key every script declares (fixes the hash slot)."""
        return self.prefix + "meta"

    def inbox(self, owner: str) -> str:
        """The list a gateway replica blocks on for its grants."""
        return f"{self.prefix}inbox:{owner}"

    def rate_bucket(self, tenant: str) -> str:
        """One tenant's rate-limit buckets (requests and tokens per minute)."""
        return f"{self.prefix}rate:{tenant}"

    def metrics(self, source: str) -> str:
        """One gateway's or replica's latest Prometheus exposition (expires unless republished)."""
        return f"{self.prefix}metrics:{source}"

    def metrics_sources(self) -> str:
        """Set of every source that has published metrics (expired ones are dropped on read)."""
        return f"{self.prefix}metrics_sources"
