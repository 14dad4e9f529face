-- Periodic sweep: reap expired leases (dead gateways and replicas), then dispatch. PAYLOAD: {}
reap()
return reply({grants = dispatch()})
