-- Dispatch, last of the library: waiting tickets, lease reaping, aging, and the grant loop that composes
-- the seams (band order -> fairness -> ordering -> gate -> placement), as ReferenceScheduler._grant_one.
--
-- The tenant index makes a grant cost O(log) in tenants and replicas: each active tenant sits in one
-- sorted set per band, the one of its next ticket's length class (the FIFO head of its least-served
-- flow), scored by its VTC counter. A class no open replica accepts is skipped whole, so tenants whose
-- next ticket cannot be placed cost nothing; otherwise the first placeable tenant of each class, in VTC
-- order, is a candidate, and the least of them is the reference's first placeable tenant.

-- keep the tenant in the index of its next ticket's class (or out of every index when it has none)
local function reindex_head(band, tenant)
  local heads = k_head_class(band)
  local old = redis.call("HGET", heads, tenant) or nil
  local class = nil
  if redis.call("ZSCORE", k_active(band), tenant) then
    class = redis.call("HGET", k_ticket(fifo_head(band, tenant, next_flow(band, tenant))), "class")
  end
  if old and old ~= class then redis.call("ZREM", k_tenant_index(band, old), tenant) end
  if class then
    redis.call("HSET", heads, tenant, class)
    redis.call("ZADD", k_tenant_index(band, class), num(counter(band, tenant)), tenant)
    redis.call("SADD", K_CLASSES, class)
  elseif old then
    redis.call("HDEL", heads, tenant)
  end
end

-- put a waiting ticket into its tenant's flow in `band`
local function push(t, band, at_head)
  activate(band, t.tenant, t.flow)
  fifo_add(band, t.tenant, t.flow, t.id, at_head)
  redis.call("HSET", k_ticket(t.id), "band", band, "entered", NOW)
  redis.call("ZADD", k_wait(band), NOW, t.id)
  count_waiting(t, band, 1)
  t.band = band
  reindex_head(band, t.tenant)
end

local function remove_waiting(t)
  local emptied = fifo_remove(t.band, t.tenant, t.flow, t.id)
  redis.call("ZREM", k_wait(t.band), t.id)
  count_waiting(t, t.band, -1)
  if emptied then deactivate_flow(t.band, t.tenant, t.flow) end
  reindex_head(t.band, t.tenant)
end

local function remove_replica(id)
  local group = redis.call("HGET", k_replica(id), "group")
  if group then unindex_replica(id, group) end
  redis.call("DEL", k_replica(id))
  redis.call("ZREM", K_REPLICAS, id)
end

local function reap()
  local dead = redis.call("ZRANGEBYSCORE", K_REPLICAS, "-inf", NOW, "LIMIT", 0, CFG.bulk_limit)
  for _, id in ipairs(dead) do remove_replica(id) end
  local expired = redis.call("ZRANGEBYSCORE", K_LEASES, "-inf", NOW, "LIMIT", 0, CFG.bulk_limit)
  if #dead == CFG.bulk_limit or #expired == CFG.bulk_limit then MORE = true end
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
  local counts = waiting_counts()
  for i = 2, #BANDS do
    local cutoff = counts[BANDS[i].name] > 0 and aging_cutoff(i)
    if cutoff then
      local aged = redis.call("ZRANGEBYSCORE", k_wait(BANDS[i].name), "-inf", cutoff, "LIMIT", 0, CFG.bulk_limit)
      if #aged == CFG.bulk_limit then MORE = true end
      for _, id in ipairs(aged) do
        local t = ticket_fields(id)
        remove_waiting(t)
        push(t, BANDS[i - 1].name, false)
        redis.call("HINCRBY", K_STATS, "promoted", 1)
      end
    end
  end
end

-- the grant's bookkeeping: the replica's capacity, the ticket, the stats, the owner's inbox
local function place(t, r)
  local reserved = math.min(t.cost, r.tokens_free)
  local placed = redis.call("HMGET", k_replica(r.id), "pool", "group")
  set_free(r.id, placed[2], r.slots_free - 1, r.tokens_free - reserved)
  local pool = placed[1] or "default"
  redis.call("HSET", k_ticket(t.id), "granted_to", r.id, "granted_pool", pool, "reserved", reserved,
    "charged_band", t.band)
  redis.call("HINCRBY", K_STATS, "granted", 1)
  if t.owner ~= "" and t.id ~= INLINE_TICKET then  -- the caller of this step gets its own grant inline
    local message = cjson.encode({ticket_id = t.id, replica_id = r.id, band = t.band, tenant = t.tenant,
      pool = pool})
    redis.call("RPUSH", k_inbox(t.owner), message)
    redis.call("PEXPIRE", k_inbox(t.owner), CFG.inbox_ttl_ms)
  end
  return {t.id, r.id, t.band, t.tenant, pool}
end

local function grant(t, r)
  charge_flow_grant(t)
  remove_waiting(t)
  charge_tenant_grant(t)
  return place(t, r)
end

-- Enqueue's fast path. When nothing waits in the ticket's band or above, a ticket that can be placed now
-- is granted without entering the queue (dispatch would grant it first); the state ends exactly as push +
-- grant would leave it (the tenant lifted to the band's virtual time and charged cost / weight; its flow
-- counters, which would have held this ticket alone, gone again), for a third of the calls. The
-- agreement test compares the two bit for bit.
local function grant_at_once(t)
  local counts = waiting_counts()
  for i = 1, BAND_INDEX[t.band] do
    if counts[BANDS[i].name] > 0 then return nil end
  end
  local r = choose_replica(replica_groups(), t.cost, t.class)
  if not r then return nil end
  local before = math.max(counter(t.band, t.tenant), tonumber(redis.call("HGET", K_VTIME, t.band) or "0"))
  redis.call("HSET", K_VTIME, t.band, num(before))
  redis.call("HSET", k_vtc(t.band), t.tenant, num(before + t.cost / t.weight))
  redis.call("HSET", k_ticket(t.id), "entered", NOW)
  return place(t, r)
end

-- the first tenant of `band` whose next ticket is of `class` and can be placed, in VTC order, if it comes
-- before `bound` (the best candidate of another class)
local first_placeable
first_placeable = function(band, class, groups, bound)
  local index, start = k_tenant_index(band, class), 0
  while true do
    local page = redis.call("ZRANGE", index, start, start + 15, "WITHSCORES")
    if not page[1] then return nil end
    for i = 1, #page, 2 do
      local tenant, score = page[i], tonumber(page[i + 1])
      if bound and (score > bound.score or (score == bound.score and not bytes_less(tenant, bound.tenant))) then
        return nil
      end
      local flow = next_flow(band, tenant)
      if not flow then  -- not active: an index entry left behind (never in a sound state); drop it
        redis.call("ZREM", index, tenant)
        redis.call("HDEL", k_head_class(band), tenant)
        return first_placeable(band, class, groups, bound)
      end
      local t = ticket_fields(fifo_head(band, tenant, flow))
      local r = choose_replica(groups, t.cost, t.class)
      if r then return {t = t, r = r, score = score, tenant = tenant} end
    end
    start = start + 16
  end
end

local function grant_one()
  local bands, counts = {}, waiting_counts()
  for _, band in ipairs(bands_in_order()) do
    if counts[band.name] > 0 then bands[#bands + 1] = band end
  end
  if not bands[1] then return nil end  -- nothing waits: no replica is read
  local groups = replica_groups()
  local classes = {}
  for _, class in ipairs(redis.call("SMEMBERS", K_CLASSES)) do
    if class_has_room(groups, class) then classes[#classes + 1] = class end
  end
  for _, band in ipairs(bands) do
    local best = nil
    for _, class in ipairs(classes) do
      best = first_placeable(band.name, class, groups, best) or best
    end
    if best then return grant(best.t, best.r) end
  end
  return nil
end

local function dispatch(promoted)
  if not promoted then promote_aged() end
  local grants = {}
  while true do
    if #grants == CFG.max_grants then
      MORE = true
      break
    end
    local g = grant_one()
    if not g then break end
    grants[#grants + 1] = g
  end
  return grants
end
