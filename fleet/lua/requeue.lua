-- Put a granted ticket back at the head of its tenant's queue (its replica was gone), undoing the charge.
-- PAYLOAD: {ticket_id}
reap()
local t = ticket_fields(PAYLOAD.ticket_id)
local moved = false
if t and t.granted_to ~= "" then
  release(t)
  charge(t.charged_band, t.tenant, -charged(t) / t.weight)
  charge_flow(t.charged_band, t.tenant, t.flow, -charged(t))
  redis.call("HSET", k_ticket(t.id), "granted_to", "", "charged_band", "", "topped", 0)
  push(t, t.band, true)
  redis.call("HINCRBY", K_STATS, "requeued", 1)
  moved = true
end
return reply({moved = moved, grants = dispatch()})
