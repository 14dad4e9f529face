-- Admit a ticket (or reject it by its band's limits), then dispatch.
-- PAYLOAD: {ticket_id, tenant, band, cost, weight, class, owner, flow}
reap()
local p = PAYLOAD
local status
local index = BAND_INDEX[p.band]
if not index then
  status = "unknown_band"
elseif redis.call("EXISTS", k_ticket(p.ticket_id)) == 1 then
  status = "duplicate"
else
  local band = BANDS[index]
  local queued = tonumber(redis.call("HGET", K_QN, p.band) or "0")
  local queued_tokens = tonumber(redis.call("HGET", K_QT, p.band) or "0")
  if queued >= band.max_queued then
    status = "queue_full"
  elseif queued_tokens + p.cost > band.max_queued_tokens then
    status = "queue_tokens_full"
  else
    redis.call("HSET", k_ticket(p.ticket_id), "tenant", p.tenant, "band", p.band, "cost", p.cost,
      "weight", num(p.weight), "class", p.class, "owner", p.owner, "granted_to", "", "reserved", 0,
      "charged_band", "", "flow", p.flow or "")
    redis.call("ZADD", K_LEASES, NOW + CFG.lease_ms, p.ticket_id)
    push({id = p.ticket_id, tenant = p.tenant, cost = p.cost, band = p.band, flow = p.flow or ""}, p.band, false)
    status = "admitted"
  end
end
if status ~= "admitted" then redis.call("HINCRBY", K_STATS, "rejected:" .. status, 1) end
return cjson.encode({status = status, grants = dispatch()})
