-- Register a replica's capacity, or renew its lease (a changed total shifts what is free), then dispatch.
-- PAYLOAD: {replica_id, slots_total, tokens_total, accepts: [class...], prefers: [class...], pool, lease_ms}
reap()
local p = PAYLOAD
local key = k_replica(p.replica_id)
local accepts = table.concat(p.accepts, ",")
local prefers = table.concat(p.prefers or {}, ",")
if redis.call("EXISTS", key) == 0 then
  redis.call("HSET", key, "slots_total", p.slots_total, "slots_free", p.slots_total,
    "tokens_total", p.tokens_total, "tokens_free", p.tokens_total, "accepts", accepts, "prefers", prefers,
    "pool", p.pool)
else
  local r = redis.call("HMGET", key, "slots_total", "slots_free", "tokens_total", "tokens_free")
  redis.call("HSET", key,
    "slots_free", tonumber(r[2]) + p.slots_total - tonumber(r[1]),
    "tokens_free", tonumber(r[4]) + p.tokens_total - tonumber(r[3]),
    "slots_total", p.slots_total, "tokens_total", p.tokens_total, "accepts", accepts, "prefers", prefers,
    "pool", p.pool)
end
redis.call("ZADD", K_REPLICAS, NOW + p.lease_ms, p.replica_id)
return cjson.encode({grants = dispatch()})
