-- Dispatch, last of the library: waiting tickets, lease reaping, aging, and the grant loop that composes
-- the seams (band order -> fairness -> ordering -> gate -> placement), as ReferenceScheduler._grant_one.

-- put a waiting ticket into its tenant's flow in `band`
local function push(t, band, at_head)
  activate(band, t.tenant, t.flow)
  fifo_add(band, t.tenant, t.flow, t.id, at_head)
  redis.call("HSET", k_ticket(t.id), "band", band, "entered", NOW)
  redis.call("ZADD", k_wait(band), NOW, t.id)
  count_waiting(t, band, 1)
  t.band = band
end

local function remove_waiting(t)
  local emptied = fifo_remove(t.band, t.tenant, t.flow, t.id)
  redis.call("ZREM", k_wait(t.band), t.id)
  count_waiting(t, t.band, -1)
  if emptied then deactivate_flow(t.band, t.tenant, t.flow) end
end

local function reap()
  local dead = redis.call("ZRANGEBYSCORE", K_REPLICAS, "-inf", NOW)
  for _, id in ipairs(dead) do
    redis.call("DEL", k_replica(id))
    redis.call("ZREM", K_REPLICAS, id)
  end
  local expired = redis.call("ZRANGEBYSCORE", K_LEASES, "-inf", NOW)
  for _, id in ipairs(expired) do
    local t = ticket_fields(id)
    if t then
      if t.granted_to == "" then
        remove_waiting(t)
      else
        release(t)
        redis.call("HINCRBY", K_STATS, "expired_granted", 1)
      end
      redis.call("HINCRBY", K_STATS, "expired", 1)
      delete_ticket(t)
    else
      redis.call("ZREM", K_LEASES, id)
    end
  end
end

local function promote_aged()
  for i = 2, #BANDS do
    local cutoff = aging_cutoff(i)
    if cutoff then
      for _, id in ipairs(redis.call("ZRANGEBYSCORE", k_wait(BANDS[i].name), "-inf", cutoff)) do
        local t = ticket_fields(id)
        remove_waiting(t)
        push(t, BANDS[i - 1].name, false)
        redis.call("HINCRBY", K_STATS, "promoted", 1)
      end
    end
  end
end

local function grant(t, r)
  charge_flow_grant(t)
  remove_waiting(t)
  charge_tenant_grant(t)
  local reserved = math.min(t.cost, r.tokens_free)
  redis.call("HSET", k_replica(r.id), "slots_free", r.slots_free - 1, "tokens_free", r.tokens_free - reserved)
  local pool = r.pool or "default"
  redis.call("HSET", k_ticket(t.id), "granted_to", r.id, "granted_pool", pool, "reserved", reserved,
    "charged_band", t.band)
  redis.call("HINCRBY", K_STATS, "granted", 1)
  local message = cjson.encode({ticket_id = t.id, replica_id = r.id, band = t.band, tenant = t.tenant,
    pool = pool})
  if t.owner ~= "" then
    redis.call("RPUSH", k_inbox(t.owner), message)
    redis.call("PEXPIRE", k_inbox(t.owner), CFG.inbox_ttl_ms)
  end
  return {t.id, r.id, t.band, t.tenant, pool}
end

local function grant_one()
  local candidates = {}
  for _, r in ipairs(load_replicas()) do
    if gate_open(r) then candidates[#candidates + 1] = r end
  end
  if #candidates == 0 then return nil end
  for _, band in ipairs(bands_in_order()) do
    for _, tenant in ipairs(tenants_in_order(band.name)) do
      local flow = next_flow(band.name, tenant)
      local t = ticket_fields(fifo_head(band.name, tenant, flow))
      local r = choose_replica(candidates, t.cost, t.class)
      if r then return grant(t, r) end
    end
  end
  return nil
end

local function dispatch()
  promote_aged()
  local grants = {}
  while #grants < CFG.max_grants do
    local g = grant_one()
    if not g then break end
    grants[#grants + 1] = g
  end
  return grants
end
