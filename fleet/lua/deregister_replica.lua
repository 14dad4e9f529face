-- Remove a replica (graceful shutdown), then dispatch. PAYLOAD: {replica_id}
reap()
redis.call("DEL", k_replica(PAYLOAD.replica_id))
redis.call("ZREM", K_REPLICAS, PAYLOAD.replica_id)
return cjson.encode({grants = dispatch()})
