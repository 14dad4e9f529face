-- Remove a replica (graceful shutdown), then dispatch. PAYLOAD: {replica_id}
reap()
if redis.call("EXISTS", k_replica(PAYLOAD.replica_id)) == 1 then
  redis.call("HINCRBY", K_STATS, "replicas_deregistered", 1)
end
remove_replica(PAYLOAD.replica_id)
return reply({grants = dispatch()})
