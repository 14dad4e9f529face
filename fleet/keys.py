"""Every Redis key name of the global queue, built in one place.

All keys of one namespace share a Redis Cluster hash tag (``{namespace}``), so each Lua step touches a
single slot; a fleet shards by giving each model or pool its own namespace.

The scripts get their key names from here: the fixed keys are declared to Redis (``KEYS``) by every call,
in the order of :meth:`QueueKeys.declared`; keys named by data (a ticket, a tenant's queue in a band) are
one *family* each, whose prefix :meth:`QueueKeys.families` passes to the scripts, which append the parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# The fixed keys, in the order every script receives them as KEYS[1..n] (lib.lua names them the same way).
DECLARED = ("meta", "vtime", "queued", "queued_tokens", "leases", "replicas", "stats", "served",
            "replica_groups", "classes", "signals", "held_out")

# Key families named by data: family -> the part after the prefix. lib.lua appends, e.g. for "queue",
# band .. ":" .. tenant .. "|" .. flow .. "|" .. class (tenant and flow ids never contain "|": the gateway
# validates them).
FAMILIES = {
    "ticket": "t:",          # ticket hash: t:<ticket id>
    "queue": "q:",           # a flow's line of waiting ticket ids of one class: q:<band>:<tenant>|<flow>|<class>
    "active": "active:",     # tenants with waiting work in a band, by VTC counter: active:<band>
    "flows": "fa:",          # a tenant's waiting flows, by flow counter: fa:<band>:<tenant>
    "flow_vtc": "fc:",       # a tenant's flow counters: fc:<band>:<tenant>
    "tenant_queued": "tq:",  # tickets waiting per tenant: tq:<band>
    "tenant_tokens": "tqt:",  # tokens waiting per tenant: tqt:<band>
    "vtc": "vtc:",           # tenants' virtual token counters: vtc:<band>
    "wait": "wait:",         # waiting tickets by the time they entered the band: wait:<band>
    "replica": "r:",         # a replica's capacity hash: r:<replica id>
    "replica_index": "ri:",  # replicas of a placement group (accepts|prefers|guarded) open to a band: ri:<group>:<band>
    "guarded_index": "gi:",  # those of them that may take the group's guarded classes now: gi:<group>:<band>
    "guarded_holders": "gh:",  # replicas of a placement group holding guarded work (it packs): gh:<group>
    "packed_index": "pi:",   # a guarding group's open replicas, fewest free slots first (it packs): pi:<group>:<band>
    "spare_replicas": "gs:",  # replicas of a guarding group holding no work (for its reserve): gs:<group>
    "tenant_index": "ti:",   # tenants with waiting tickets of a class, by VTC counter: ti:<band>:<class>
    "class_flows": "tcf:",   # a tenant's flows with waiting tickets of a class, by flow counter: tcf:<band>:<tenant>|<class>
    "rate": "rate:",         # a tenant's rate-limit buckets: rate:<tenant>
    "inbox": "inbox:",       # a gateway's grant inbox (a list it blocks on): inbox:<owner>
}  # fmt: skip


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
        """What every key of this namespace starts with (its hash tag included)."""
        return f"{self.root}:{{{self.namespace}}}:"

    def declared(self) -> list[str]:
        """The fixed keys, as every script call declares them (KEYS), in ``DECLARED`` order."""
        return [self.prefix + name for name in DECLARED]

    def families(self) -> dict[str, str]:
        """Each data-named key family's prefix, as the scripts receive them."""
        return {family: self.prefix + part for family, part in FAMILIES.items()}

    def ticket(self, ticket_id: str) -> str:
        """One ticket's hash (who it is granted to, among the rest)."""
        return f"{self.prefix}{FAMILIES['ticket']}{ticket_id}"

    def inbox(self, owner: str) -> str:
        """The list a gateway replica blocks on for its grants."""
        return f"{self.prefix}{FAMILIES['inbox']}{owner}"

    def flow_counters(self, band: str, tenant: str) -> str:
        """One tenant's flow counters in a band (a hash flow -> counter)."""
        return f"{self.prefix}{FAMILIES['flow_vtc']}{band}:{tenant}"

    def rate_bucket(self, tenant: str) -> str:
        """One tenant's rate-limit buckets (requests and tokens per minute)."""
        return f"{self.prefix}{FAMILIES['rate']}{tenant}"

    def metrics(self, source: str) -> str:
        """One gateway's or replica's latest Prometheus exposition (expires unless republished)."""
        return f"{self.prefix}metrics:{source}"

    def metrics_sources(self) -> str:
        """Set of every source that has published metrics (expired ones are dropped on read)."""
        return f"{self.prefix}metrics_sources"
