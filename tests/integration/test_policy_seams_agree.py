"""Seam by seam, the Lua library and the Python policies give the same answer on the same inputs.

The whole dispatch is compared on random workloads in test_lua_matches_reference.py; here the pure seams
(the gate, placement's filter -> scorer -> picker, band order's aging cut-off) are probed one at a time
inside Redis, so a change to one seam in one language fails by name.
"""

from __future__ import annotations

import json
import random

import pytest
import redis

from fleet.keys import QueueKeys
from fleet.lua_sources import script_around
from fleet.queue import QueueSettings
from policies.band_order import aging_cutoff
from policies.gate import gate_open, open_replicas
from policies.placement import choose_replica, group_loads, guarded_classes
from policies.types import BandPolicy, EngineSignals, ReplicaCapacity

pytestmark = pytest.mark.integration

BANDS = (BandPolicy("top", max_unstarted_steps=3.0, kv_ceiling=0.95),
         BandPolicy("mid", aging_ms=700, max_unstarted_steps=2.0, kv_ceiling=0.8),
         BandPolicy("low", aging_ms=0, max_unstarted_steps=2.0, kv_ceiling=0.5),
         BandPolicy("bulk", aging_ms=90, max_unstarted_steps=1.0, kv_ceiling=0.5))
PROBE = """
local open = {}
for _, p in ipairs(PAYLOAD.replicas) do
  local group = table.concat(p.accepts, ",") .. "|" .. table.concat(p.prefers, ",") .. "|" ..
    table.concat(p.guarded, ",")
  redis.call("HSET", k_replica(p.id), "slots_total", p.slots_total, "tokens_total", p.tokens_total,
    "pool", p.pool, "group", group, "slots_free", p.slots_free, "tokens_free", p.tokens_free,
    "in_flight_tokens", p.in_flight, "unstarted_tokens", p.unstarted, "kv", num(p.kv), "fresh", p.fresh and 1 or 0,
    "step_tokens", p.step_tokens, "guarded_held", p.guarded_held, "reserve", p.reserve)
  redis.call("HINCRBY", K_GROUPS, group, 1)
  index_replica(p.id)
  local bands = {}
  for _, band in ipairs(BANDS) do
    if gate_open(replica_state(p.id), band) then bands[#bands + 1] = band.name end
  end
  open[#open + 1] = table.concat(bands, ",")
end
local groups = replica_groups()
local placed = {}
for _, ask in ipairs(PAYLOAD.asks) do
  local r = choose_replica(groups, ask.band, ask.cost, ask.class)
  placed[#placed + 1] = r and r.id or ""
end
local cutoffs = {}
for i = 1, #BANDS do cutoffs[#cutoffs + 1] = aging_cutoff(i) or -1 end
return cjson.encode({open = open, placed = placed, cutoffs = cutoffs})
"""


def _replica(rng: random.Random, index: int) -> ReplicaCapacity:
    accepts = rng.choice([frozenset({"short", "long"}), frozenset({"short"}), frozenset({"long"})])
    slots = rng.randint(1, 4)
    tokens = rng.choice([300, 600, 1500])
    signals = EngineSignals(unstarted_tokens=rng.choice([0, 0, 100, 300, 700]), kv_usage=rng.choice([0.1, 0.5, 0.8, 0.97]))
    preferred = frozenset(c for c in accepts if rng.random() < 0.4)
    guarded = guarded_classes(accepts, preferred, ["short", "long"])
    slots_free = rng.randint(0, slots)
    return ReplicaCapacity(f"r{index}", slots, tokens, accepts=accepts, pool=rng.choice(["a", "b"]),
                           prefers=preferred, guarded=guarded,
                           guarded_held=rng.randint(0, slots - slots_free) if guarded else 0,
                           slots_free=slots_free, tokens_free=rng.randint(0, tokens),
                           signals=signals, fresh=rng.random() < 0.7, in_flight_tokens=rng.choice([0, 0, 50, 200]),
                           step_tokens=rng.choice([100, 250]))


def _latency_replica(rng: random.Random, index: int) -> ReplicaCapacity:
    """A replica of one latency pool (short preferred, long guarded, a reserve of one), in few distinct states:
    the group packs its short work (``r0`` holds guarded work), its reserve counts the empty ones, and ties on
    pending work leave the order to free slots."""
    slots = rng.randint(2, 6)
    slots_free = rng.randint(0, slots - 1) if index == 0 else rng.randint(0, slots)  # r0 holds guarded work
    return ReplicaCapacity(f"r{index}", slots, 1500, accepts=frozenset({"short", "long"}), pool="latency",
                           prefers=frozenset({"short"}), guarded=frozenset({"long"}), reserve=1,
                           guarded_held=slots - slots_free if index == 0 else rng.choice([0, 0, slots - slots_free]),
                           slots_free=slots_free,
                           tokens_free=1500 - 100 * (slots - slots_free),
                           signals=EngineSignals(unstarted_tokens=rng.choice([0, 0, 0, 100])), fresh=rng.random() < 0.9,
                           in_flight_tokens=rng.choice([0, 0, 0, 50]), step_tokens=250)


@pytest.mark.parametrize("fleet", ["mixed", "latency"])
@pytest.mark.parametrize("seed", range(12))
def test_gate_placement_and_band_order_agree(redis_url: str, seed: int, fleet: str) -> None:
    rng = random.Random(seed)
    make = _replica if fleet == "mixed" else _latency_replica
    replicas = [make(rng, i) for i in range(rng.randint(1, 7) if fleet == "mixed" else rng.randint(3, 8))]
    asks = [{"cost": rng.randint(1, 1600), "class": rng.choice(["short", "long"]), "band": rng.choice(BANDS).name}
            for _ in range(60)]
    keys = QueueKeys(namespace=f"seams{seed}{fleet}")
    source = script_around(PROBE)
    payload = {"asks": asks, "replicas": [
        {"id": r.replica_id, "slots_total": r.slots_total, "slots_free": r.slots_free, "tokens_total": r.tokens_total,
         "tokens_free": r.tokens_free, "accepts": sorted(r.accepts), "prefers": sorted(r.prefers), "pool": r.pool,
         "guarded": sorted(r.guarded),
         "in_flight": r.in_flight_tokens, "unstarted": r.signals.unstarted_tokens, "kv": r.signals.kv_usage,
         "fresh": r.fresh, "step_tokens": r.step_tokens, "guarded_held": r.guarded_held, "reserve": r.reserve}
        for r in replicas]}
    now = 1_000_000
    client = redis.Redis.from_url(redis_url)
    raw = client.eval(source, len(keys.declared()), *keys.declared(), QueueSettings(BANDS).to_json(keys), str(now),
                      json.dumps(payload))
    got = json.loads(raw)
    assert (got["open"] or []) == [",".join(b.name for b in BANDS if gate_open(r, b)) for r in replicas]
    band = {b.name: b for b in BANDS}
    loads = group_loads(replicas)
    want = [getattr(choose_replica(open_replicas(replicas, band[a["band"]]), a["cost"], a["class"], loads),
                    "replica_id", "") for a in asks]
    assert got["placed"] == want
    assert got["cutoffs"] == [c if (c := aging_cutoff(BANDS, i, now)) is not None else -1 for i in range(len(BANDS))]
