-- Extend the leases of a gateway's tickets (waiting or granted). PAYLOAD: {ticket_ids: [...], lease_ms}
-- Returns how many still exist and which do not (lost: Redis restarted or their lease had lapsed), so the
-- gateway answers their waiting requests at once instead of letting them wait for a grant that cannot come.
reap()
local alive = 0
local missing = {}
for _, id in ipairs(PAYLOAD.ticket_ids) do
  if redis.call("EXISTS", k_ticket(id)) == 1 then
    redis.call("ZADD", K_LEASES, NOW + PAYLOAD.lease_ms, id)
    alive = alive + 1
  else
    missing[#missing + 1] = id
  end
end
return reply({alive = alive, missing = missing})
