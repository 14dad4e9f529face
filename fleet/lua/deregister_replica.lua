-- Remove a replica (graceful shutdown), then dispatch. PAYLOAD: {replica_id}
reap()
remove_replica(PAYLOAD.replica_id)
return reply({grants = dispatch()})
