-- Remove a replica (graceful shutdown, or a gateway found it unreachable), then dispatch.
-- PAYLOAD: {replica_id, hold_ms}: hold_ms > 0 keeps it out that long (its heartbeat cannot bring it back).
reap()
if redis.call("EXISTS", k_replica(PAYLOAD.replica_id)) == 1 then
  redis.call("HINCRBY", K_STATS, "replicas_deregistered", 1)
end
if (PAYLOAD.hold_ms or 0) > 0 then
  redis.call("ZADD", K_HELD_OUT, NOW + PAYLOAD.hold_ms, PAYLOAD.replica_id)
  redis.call("HINCRBY", K_STATS, "replicas_held_out", 1)
end
remove_replica(PAYLOAD.replica_id)
return reply({grants = dispatch()})
