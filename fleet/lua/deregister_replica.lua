-- Remove a replica (graceful shutdown, or a gateway found it unreachable), then dispatch.
-- PAYLOAD: {replica_id, hold_ms}: hold_ms > 0 keeps it out that long (its heartbeat cannot bring it back).
reap()
if redis.call("EXISTS", k_replica(PAYLOAD.replica_id)) == 1 then
  redis.call("HINCRBY", K_STATS, "replicas_deregistered", 1)
end
if (PAYLOAD.hold_ms or 0) > 0 then
  local held_until = tonumber(redis.call("ZSCORE", K_HELD_OUT, PAYLOAD.replica_id))
  if not held_until or held_until <= NOW then  -- counted once a hold, not at each renewal
    redis.call("HINCRBY", K_STATS, "replicas_held_out", 1)
  end
  redis.call("ZADD", K_HELD_OUT, NOW + PAYLOAD.hold_ms, PAYLOAD.replica_id)
end
remove_replica(PAYLOAD.replica_id)
return reply({grants = dispatch()})
