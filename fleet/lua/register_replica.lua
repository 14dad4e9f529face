-- Register a replica's capacity, or renew its lease (a changed total shifts what is free), then dispatch.
-- A replica held out (deregister_replica's hold_ms) is not registered again until its hold ends.
-- A new replica's signals start stale (the gate's concurrency cap) until its first report.
-- PAYLOAD: {replica_id, slots_total, tokens_total, accepts: [class...], prefers: [class...],
--          guarded: [class...], pool, step_tokens, prefill_chunk, reserve, lease_ms}
reap()
local p = PAYLOAD
if p.slots_total >= 524288 or p.tokens_total >= TOKENS_LIMIT or p.step_tokens < 1 then
  return redis.error_reply("replica capacity out of range: slots < 2^19, tokens < 2^32, step_tokens >= 1")
end
local key = k_replica(p.replica_id)
-- a replica a gateway found unreachable after delivering to it (Serve is draining it) stays out until its
-- hold ends
redis.call("ZREMRANGEBYSCORE", K_HELD_OUT, "-inf", NOW)
if redis.call("EXISTS", key) == 0 and redis.call("ZSCORE", K_HELD_OUT, p.replica_id) then
  return reply({grants = dispatch()})
end
local accepts = table.concat(p.accepts, ",")
local prefers = table.concat(p.prefers or {}, ",")
local group = accepts .. "|" .. prefers .. "|" .. table.concat(p.guarded or {}, ",")
local slots_free, tokens_free = p.slots_total, p.tokens_total
local joins_group = true
if redis.call("EXISTS", key) == 1 then
  local r = redis.call("HMGET", key, "slots_total", "slots_free", "tokens_total", "tokens_free", "group")
  slots_free = tonumber(r[2]) + p.slots_total - tonumber(r[1])
  tokens_free = tonumber(r[4]) + p.tokens_total - tonumber(r[3])
  if r[5] == group then
    joins_group = false
  else
    unindex_replica(p.replica_id, r[5])
  end
else  -- a new registration (first, or after a lapse or a deregistration): its own epoch, so grants made to
  -- an earlier one return nothing to it
  local epoch = redis.call("HINCRBY", K_STATS, "replicas_registered", 1)
  redis.call("HSET", key, "in_flight", 0, "in_flight_tokens", 0, "guarded_held", 0, "fresh", 0, "epoch", epoch)
end
if joins_group then redis.call("HINCRBY", K_GROUPS, group, 1) end
redis.call("HSET", key, "slots_total", p.slots_total, "tokens_total", p.tokens_total, "accepts", accepts,
  "prefers", prefers, "pool", p.pool, "group", group, "slots_free", slots_free, "tokens_free", tokens_free,
  "step_tokens", p.step_tokens, "prefill_chunk", p.prefill_chunk, "reserve", p.reserve or 0)
index_replica(p.replica_id)
redis.call("ZADD", K_REPLICAS, NOW + p.lease_ms, p.replica_id)
return reply({grants = dispatch()})
