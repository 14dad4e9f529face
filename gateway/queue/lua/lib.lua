-- Shared part of every global-queue script: state access, reaping, aging, dispatch.
-- It mirrors policies/reference_scheduler.py step for step; a test runs random workloads through both
-- and compares every decision. Keep the two in lockstep.
--
-- Calling convention of every script:
--   KEYS[1]  the namespace's meta key (declares the hash slot; every key shares its {hash tag})
--   ARGV[1]  key prefix, e.g. "fg:{default}:"
--   ARGV[2]  JSON config: {"bands": [{"name", "aging_ms", "max_queued", "max_queued_tokens"}],
--            "max_grants": n, "lease_ms": n, "inbox_ttl_ms": n}
--   ARGV[3]  now in ms, or "" to use the Redis server's clock (production: one clock for all gateways)
--   ARGV[4]  the script's own JSON payload
-- Counters are doubles formatted with %.17g so they round-trip exactly (Python floats agree bit for bit).

local P = ARGV[1]
local CFG = cjson.decode(ARGV[2])
local NOW
if ARGV[3] ~= nil and ARGV[3] ~= "" then
  NOW = tonumber(ARGV[3])
else
  local t = redis.call("TIME")
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local PAYLOAD = cjson.decode(ARGV[4])

local BANDS = {}
local BAND_INDEX = {}
for i, band in ipairs(CFG.bands) do
  BANDS[i] = band
  BAND_INDEX[band.name] = i
end

local function num(x) return string.format("%.17g", x) end

local function k_ticket(id) return P .. "t:" .. id end
-- tenant ids never contain "|" (the gateway validates them), so "tenant|flow" is unambiguous
local function k_queue(band, tenant, flow) return P .. "q:" .. band .. ":" .. tenant .. "|" .. flow end
local function k_active(band) return P .. "active:" .. band end
local function k_flows(band, tenant) return P .. "fa:" .. band .. ":" .. tenant end
local function k_flow_vtc(band, tenant) return P .. "fc:" .. band .. ":" .. tenant end
local function k_tenant_queued(band) return P .. "tq:" .. band end
local function k_tenant_tokens(band) return P .. "tqt:" .. band end
local function k_vtc(band) return P .. "vtc:" .. band end
local function k_wait(band) return P .. "wait:" .. band end
local function k_replica(id) return P .. "r:" .. id end
local function k_inbox(owner) return P .. "inbox:" .. owner end
local K_VTIME = P .. "vtime"
local K_QN = P .. "queued"
local K_QT = P .. "queued_tokens"
local K_LEASES = P .. "leases"
local K_REPLICAS = P .. "replicas"
local K_STATS = P .. "stats"
local K_SERVED = P .. "served"  -- tokens charged per tenant at completion (what the ledger check compares)

local function counter(band, tenant)
  return tonumber(redis.call("HGET", k_vtc(band), tenant) or "0")
end

local function set_counter(band, tenant, value)
  redis.call("HSET", k_vtc(band), tenant, num(value))
  if redis.call("ZSCORE", k_active(band), tenant) then
    redis.call("ZADD", k_active(band), num(value), tenant)
  end
end

local function charge(band, tenant, amount)
  set_counter(band, tenant, counter(band, tenant) + amount)
end

-- a flow's service inside its tenant; kept only while the tenant has waiting work in the band
local function charge_flow(band, tenant, flow, amount)
  local flows = k_flows(band, tenant)
  if redis.call("ZCARD", flows) == 0 then return end
  local value = tonumber(redis.call("HGET", k_flow_vtc(band, tenant), flow) or "0") + amount
  redis.call("HSET", k_flow_vtc(band, tenant), flow, num(value))
  if redis.call("ZSCORE", flows, flow) then
    redis.call("ZADD", flows, num(value), flow)
  end
end

local function ticket_fields(id)
  local f = redis.call("HMGET", k_ticket(id), "tenant", "band", "cost", "weight", "class", "owner",
    "granted_to", "reserved", "charged_band", "flow")
  if not f[1] then return nil end
  return {id = id, tenant = f[1], band = f[2], cost = tonumber(f[3]), weight = tonumber(f[4]), class = f[5],
    owner = f[6], granted_to = f[7] or "", reserved = tonumber(f[8] or "0"), charged_band = f[9] or "",
    flow = f[10] or ""}
end

-- push a waiting ticket onto its tenant's queue in `band` (lifting the tenant's counter on activation)
local function push(t, band, at_head)
  local active = k_active(band)
  if not redis.call("ZSCORE", active, t.tenant) then
    local floor
    local lowest = redis.call("ZRANGE", active, 0, 0, "WITHSCORES")
    if lowest[1] then
      floor = tonumber(lowest[2])
    else
      floor = tonumber(redis.call("HGET", K_VTIME, band) or "0")
    end
    local lifted = math.max(counter(band, t.tenant), floor)
    redis.call("HSET", k_vtc(band), t.tenant, num(lifted))
    redis.call("ZADD", active, num(lifted), t.tenant)
  end
  local flows = k_flows(band, t.tenant)
  if not redis.call("ZSCORE", flows, t.flow) then
    local floor = 0
    local lowest = redis.call("ZRANGE", flows, 0, 0, "WITHSCORES")
    if lowest[1] then floor = tonumber(lowest[2]) end
    local current = tonumber(redis.call("HGET", k_flow_vtc(band, t.tenant), t.flow) or "0")
    local lifted = math.max(current, floor)
    redis.call("HSET", k_flow_vtc(band, t.tenant), t.flow, num(lifted))
    redis.call("ZADD", flows, num(lifted), t.flow)
  end
  if at_head then
    redis.call("LPUSH", k_queue(band, t.tenant, t.flow), t.id)
  else
    redis.call("RPUSH", k_queue(band, t.tenant, t.flow), t.id)
  end
  redis.call("HSET", k_ticket(t.id), "band", band, "entered", NOW)
  redis.call("ZADD", k_wait(band), NOW, t.id)
  redis.call("HINCRBY", K_QN, band, 1)
  redis.call("HINCRBY", K_QT, band, t.cost)
  redis.call("HINCRBY", k_tenant_queued(band), t.tenant, 1)
  redis.call("HINCRBY", k_tenant_tokens(band), t.tenant, t.cost)
  t.band = band
end

local function remove_waiting(t)
  local queue = k_queue(t.band, t.tenant, t.flow)
  redis.call("LREM", queue, 1, t.id)
  redis.call("ZREM", k_wait(t.band), t.id)
  redis.call("HINCRBY", K_QN, t.band, -1)
  redis.call("HINCRBY", K_QT, t.band, -t.cost)
  if redis.call("HINCRBY", k_tenant_queued(t.band), t.tenant, -1) <= 0 then
    redis.call("HDEL", k_tenant_queued(t.band), t.tenant)
    redis.call("HDEL", k_tenant_tokens(t.band), t.tenant)
  else
    redis.call("HINCRBY", k_tenant_tokens(t.band), t.tenant, -t.cost)
  end
  if redis.call("LLEN", queue) == 0 then
    local flows = k_flows(t.band, t.tenant)
    redis.call("ZREM", flows, t.flow)
    if redis.call("ZCARD", flows) == 0 then  -- the tenant's last waiting ticket: its flow counters go too
      redis.call("ZREM", k_active(t.band), t.tenant)
      redis.call("DEL", k_flow_vtc(t.band, t.tenant))
    end
  end
end

local function release(t)
  local key = k_replica(t.granted_to)
  if t.granted_to ~= "" and redis.call("EXISTS", key) == 1 then
    local r = redis.call("HMGET", key, "slots_total", "slots_free", "tokens_total", "tokens_free")
    local slots = math.min(tonumber(r[1]), tonumber(r[2]) + 1)
    local tokens = math.min(tonumber(r[3]), tonumber(r[4]) + t.reserved)
    redis.call("HSET", key, "slots_free", slots, "tokens_free", tokens)
  end
  redis.call("HSET", k_ticket(t.id), "reserved", 0)
  t.reserved = 0
end

local function delete_ticket(t)
  redis.call("DEL", k_ticket(t.id))
  redis.call("ZREM", K_LEASES, t.id)
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
    local band = BANDS[i]
    if band.aging_ms > 0 then
      local aged = redis.call("ZRANGEBYSCORE", k_wait(band.name), "-inf", NOW - band.aging_ms)
      for _, id in ipairs(aged) do
        local t = ticket_fields(id)
        remove_waiting(t)
        push(t, BANDS[i - 1].name, false)
        redis.call("HINCRBY", K_STATS, "promoted", 1)
      end
    end
  end
end

local function load_replicas()
  local ids = redis.call("ZRANGE", K_REPLICAS, 0, -1)
  local replicas = {}
  local any_free = false
  for _, id in ipairs(ids) do
    local r = redis.call("HMGET", k_replica(id), "slots_total", "slots_free", "tokens_total", "tokens_free",
      "accepts", "prefers", "pool")
    local rep = {id = id, slots_total = tonumber(r[1]), slots_free = tonumber(r[2]),
      tokens_total = tonumber(r[3]), tokens_free = tonumber(r[4]), accepts = {}, prefers = {}, pool = r[7]}
    for class in string.gmatch(r[5] or "", "[^,]+") do rep.accepts[class] = true end
    for class in string.gmatch(r[6] or "", "[^,]+") do rep.prefers[class] = true end
    if rep.slots_free > 0 then any_free = true end
    replicas[#replicas + 1] = rep
  end
  return replicas, any_free
end

-- policies/placement.py: fits, then a replica preferring the class, most free slots, most free tokens,
-- smallest id
local function better(a, b, class)
  local pa, pb = a.prefers[class] == true, b.prefers[class] == true
  if pa ~= pb then return pa end
  if a.slots_free ~= b.slots_free then return a.slots_free > b.slots_free end
  if a.tokens_free ~= b.tokens_free then return a.tokens_free > b.tokens_free end
  return a.id < b.id
end

local function choose_replica(replicas, cost, class)
  local best = nil
  for _, r in ipairs(replicas) do
    local fits = r.accepts[class] and r.slots_free >= 1 and
      (r.tokens_free >= cost or r.slots_free == r.slots_total)
    if fits and (best == nil or better(r, best, class)) then
      best = r
    end
  end
  return best
end

local function grant(t, r)
  charge_flow(t.band, t.tenant, t.flow, t.cost)  -- while the flow still waits
  remove_waiting(t)
  local before = counter(t.band, t.tenant)
  redis.call("HSET", K_VTIME, t.band, num(before))
  set_counter(t.band, t.tenant, before + t.cost / t.weight)
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
  local replicas, any_free = load_replicas()
  if not any_free then return nil end
  for _, band in ipairs(BANDS) do
    local tenants = redis.call("ZRANGE", k_active(band.name), 0, -1)
    for _, tenant in ipairs(tenants) do
      local flow = redis.call("ZRANGE", k_flows(band.name, tenant), 0, 0)[1]
      local head = redis.call("LINDEX", k_queue(band.name, tenant, flow), 0)
      local t = ticket_fields(head)
      local r = choose_replica(replicas, t.cost, t.class)
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
