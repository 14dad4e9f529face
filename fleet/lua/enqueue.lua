-- Admit a ticket (or reject it: its tenant's rate limits, its band's limits), then dispatch.
-- PAYLOAD: {ticket_id, tenant, band, cost, weight, class, owner, flow, prompt, ceiling, rpm, tpm} (rpm, tpm: the tenant's
-- limits, absent when unlimited). A repeat of an enqueue that went through answers "duplicate", with the
-- ticket's grant if it has one (the retried caller never got the first reply).
-- whether the tenant's waiting tickets in the band would pass its share of the band's limits
local function tenant_over_share(band, tenant, cost)
  local mine = tonumber(redis.call("HGET", k_tenant_queued(band.name), tenant) or "0")
  local mine_tokens = tonumber(redis.call("HGET", k_tenant_tokens(band.name), tenant) or "0")
  return mine >= band.tenant_share * band.max_queued
    or mine_tokens + cost > band.tenant_share * band.max_queued_tokens
end

reap()
promote_aged()  -- aged tickets move up before this one enters: they arrived earlier
local p = PAYLOAD
local status, retry_ms, held_ms = nil, 0, 0
local index = BAND_INDEX[p.band]
local own_grant = nil
if not index then
  status = "unknown_band"
elseif redis.call("EXISTS", k_ticket(p.ticket_id)) == 1 then
  status = "duplicate"
  local t = ticket_fields(p.ticket_id)
  if t.granted_to ~= "" then
    own_grant = {t.id, t.granted_to, t.charged_band, t.tenant,
      redis.call("HGET", k_ticket(t.id), "granted_pool") or "default"}
  end
else
  local band = BANDS[index]
  local queued = waiting_counts()[p.band]
  local queued_tokens = tonumber(redis.call("HGET", K_QT, p.band) or "0")
  if queued >= band.max_queued then
    status = "queue_full"
  elseif queued_tokens + p.cost > band.max_queued_tokens then
    status = "queue_tokens_full"
  elseif tenant_over_share(band, p.tenant, p.cost) then
    status = "tenant_queue_full"
  else
    retry_ms, held_ms = rate_take(p.tenant, p.rpm, p.tpm, p.cost)
    if retry_ms > 0 then status = "rate_limited" end
  end
  if not status then
    local fields = {"tenant", p.tenant, "band", p.band, "cost", p.cost, "weight", num(p.weight), "class", p.class,
      "owner", p.owner, "granted_to", "", "reserved", 0, "charged_band", "", "flow", p.flow or "",
      "asked_flow", p.flow or "",
      "prompt", p.prompt or p.cost, "ceiling", p.ceiling or ""}
    if p.rpm then fields[#fields + 1] = "rpm"; fields[#fields + 1] = p.rpm end
    if p.tpm then fields[#fields + 1] = "tpm"; fields[#fields + 1] = p.tpm end
    redis.call("HSET", k_ticket(p.ticket_id), unpack(fields))
    redis.call("ZADD", K_LEASES, NOW + CFG.lease_ms, p.ticket_id)
    local t = {id = p.ticket_id, tenant = p.tenant, cost = p.cost, band = p.band, flow = p.flow or "",
      asked_flow = p.flow or "",
      weight = tonumber(num(p.weight)), class = p.class, owner = p.owner, prompt = p.prompt or p.cost}
    own_grant = grant_at_once(t)
    if not own_grant then push(t, p.band, false) end
    status = "admitted"
  end
end
if status ~= "admitted" then redis.call("HINCRBY", K_STATS, "rejected:" .. status, 1) end
local grants = dispatch(true)
if own_grant then table.insert(grants, 1, own_grant) end
return reply({status = status, grants = grants, retry_after_ms = retry_ms, held_ms = held_ms})
