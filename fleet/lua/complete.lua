-- Finish a granted ticket exactly once: return its capacity, correct the charge to the actual tokens.
-- PAYLOAD: {ticket_id, actual_cost}
reap()
local t = ticket_fields(PAYLOAD.ticket_id)
local done = false
if t and t.granted_to ~= "" then
  release(t)
  charge(t.charged_band, t.tenant, (PAYLOAD.actual_cost - charged(t)) / t.weight)
  charge_flow(t.charged_band, t.tenant, t.flow, PAYLOAD.actual_cost - charged(t))
  delete_ticket(t)
  redis.call("HINCRBY", K_STATS, "completed", 1)
  redis.call("HINCRBY", K_STATS, "served_tokens", PAYLOAD.actual_cost)
  redis.call("HINCRBY", K_SERVED, t.tenant, PAYLOAD.actual_cost)
  rate_settle(t.tenant, t.rpm, t.tpm, PAYLOAD.actual_cost - charged(t))
  done = true
end
return reply({done = done, grants = dispatch()})
