-- Withdraw a waiting ticket. Status: "cancelled", "granted" (a grant won the race; it stands, and its
-- replica and pool are returned), "unknown".
-- PAYLOAD: {ticket_id}
reap()
local t = ticket_fields(PAYLOAD.ticket_id)
local status, replica_id, pool = "unknown", "", ""
if t and t.granted_to ~= "" then
  status, replica_id = "granted", t.granted_to
  pool = redis.call("HGET", k_ticket(t.id), "granted_pool") or "default"
elseif t then
  remove_waiting(t)
  delete_ticket(t)
  rate_settle(t.tenant, t.rpm, t.tpm, -t.cost)  -- nothing was served: the estimate goes back
  redis.call("HINCRBY", K_STATS, "cancelled", 1)
  status = "cancelled"
end
return reply({status = status, replica_id = replica_id, pool = pool, grants = dispatch()})
