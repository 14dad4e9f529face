-- Extend the leases of a gateway's tickets (waiting or granted). PAYLOAD: {ticket_ids: [...], lease_ms}
reap()
local alive = 0
for _, id in ipairs(PAYLOAD.ticket_ids) do
  if redis.call("EXISTS", k_ticket(id)) == 1 then
    redis.call("ZADD", K_LEASES, NOW + PAYLOAD.lease_ms, id)
    alive = alive + 1
  end
end
return cjson.encode({alive = alive})
