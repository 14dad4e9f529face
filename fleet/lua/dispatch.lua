-- Dispatch, last of the library: waiting tickets, lease reaping, aging, and the grant loop that composes
-- the seams (band order -> fairness -> ordering -> gate -> placement), as ReferenceScheduler._grant_one.
--
-- The tenant index makes a grant cost O(log) in tenants and replicas: a tenant with waiting tickets of a
-- length class sits in that class's sorted set of the band, scored by its VTC counter, and inside it its
-- flows with tickets of the class by flow counter; each flow has one line per class (ordering.lua). A
-- class no replica open to the band can take is skipped whole, so tickets that cannot be placed cost
-- nothing. Otherwise each class offers its first placeable candidate in the reference's order (tenant by
-- counter, flow by counter, place in the flow), and the first of those is the reference's choice.

-- put a waiting ticket into its tenant's flow in `band`
local function push(t, band, at_head)
  t.flow = flow_of(band, t.tenant, t.asked_flow)
  activate(band, t.tenant, t.flow)
  t.position = next_position(at_head)
  if fifo_add(band, t.tenant, t.flow, t.class, t.id, at_head) then join_class(band, t.tenant, t.flow, t.class) end
  redis.call("HSET", k_ticket(t.id), "band", band, "entered", NOW, "position", t.position, "flow", t.flow)
  redis.call("ZADD", k_wait(band), NOW, t.id)
  count_waiting(t, band, 1)
  t.band = band
end

-- whether the flow still has a waiting ticket of any class in `band`
local function flow_waits(band, tenant, flow)
  local lines = {}
  for i, class in ipairs(known_classes()) do lines[i] = k_queue(band, tenant, flow, class) end
  return redis.call("EXISTS", unpack(lines)) > 0
end

local function remove_waiting(t)
  if fifo_remove(t.band, t.tenant, t.flow, t.class, t.id) then
    leave_class(t.band, t.tenant, t.flow, t.class)
    if not flow_waits(t.band, t.tenant, t.flow) then deactivate_flow(t.band, t.tenant, t.flow) end
  end
  redis.call("ZREM", k_wait(t.band), t.id)
  count_waiting(t, t.band, -1)
end

local function remove_replica(id)
  local group = redis.call("HGET", k_replica(id), "group")
  if group then unindex_replica(id, group) end
  redis.call("DEL", k_replica(id))
  redis.call("ZREM", K_REPLICAS, id)
  redis.call("ZREM", K_SIGNALS, id)
end

-- a grant's capacity goes back to its replica if the same registration still stands (one that lapsed or
-- left and registered again started afresh, with all its capacity free and no credit in flight); an
-- unacknowledged grant's in-flight credit ends with it
local function release(t)
  local r = t.granted_to ~= "" and replica_state(t.granted_to)
  if r and r.epoch == t.granted_epoch then
    r.slots_free = math.min(r.slots_total, r.slots_free + 1)
    r.tokens_free = math.min(r.tokens_total, r.tokens_free + t.reserved)
    if not t.acked then
      r.in_flight, r.in_flight_tokens = r.in_flight - 1, r.in_flight_tokens - t.credit
    end
    if t.guarded then r.guarded_held = r.guarded_held - 1 end
    redis.call("HSET", k_replica(r.id), "slots_free", r.slots_free, "tokens_free", r.tokens_free,
      "in_flight", r.in_flight, "in_flight_tokens", r.in_flight_tokens, "guarded_held", r.guarded_held)
    index_replica(r.id, r)
  end
  redis.call("HSET", k_ticket(t.id), "reserved", 0, "acked", 0, "guarded", 0)
  t.reserved, t.acked, t.guarded = 0, false, false
end

local function reap()
  local dead = redis.call("ZRANGEBYSCORE", K_REPLICAS, "-inf", NOW, "LIMIT", 0, CFG.bulk_limit)
  for _, id in ipairs(dead) do remove_replica(id) end
  if #dead > 0 then redis.call("HINCRBY", K_STATS, "replicas_lapsed", #dead) end
  -- signals not renewed in time: the gate falls back to the replica's concurrency cap
  local stale = redis.call("ZRANGEBYSCORE", K_SIGNALS, "-inf", NOW - CFG.signal_stale_ms, "LIMIT", 0, CFG.bulk_limit)
  for _, id in ipairs(stale) do
    redis.call("HSET", k_replica(id), "fresh", 0)
    redis.call("ZREM", K_SIGNALS, id)
    index_replica(id)
  end
  local expired = redis.call("ZRANGEBYSCORE", K_LEASES, "-inf", NOW, "LIMIT", 0, CFG.bulk_limit)
  if #dead == CFG.bulk_limit or #stale == CFG.bulk_limit or #expired == CFG.bulk_limit then MORE = true end
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
        if may_age_into(i - 1, t.ceiling) then
          remove_waiting(t)
          push(t, BANDS[i - 1].name, false)
          redis.call("HINCRBY", K_STATS, "promoted", 1)
        else  -- at its tenant's ceiling: it ages no further here (a push puts it back in the aging index)
          redis.call("ZREM", k_wait(BANDS[i].name), id)
        end
      end
    end
  end
end

-- the grant's bookkeeping: the replica's capacity and in-flight credit, the ticket, the stats, the owner's
-- inbox
local function place(t, r)
  local s = replica_state(r.id)
  local reserved = math.min(t.cost, s.tokens_free)
  local chunk = s.prefill_chunk
  if chunk == 0 then chunk = s.step_tokens end
  local credit = math.min(t.prompt, chunk)  -- the grant's share of a step, until acknowledged
  s.slots_free, s.tokens_free = s.slots_free - 1, s.tokens_free - reserved
  s.in_flight, s.in_flight_tokens = s.in_flight + 1, s.in_flight_tokens + credit
  local guarded = r.guarded[t.class] == true  -- counted in the replica's guarded work until it ends
  if guarded then s.guarded_held = s.guarded_held + 1 end
  redis.call("HSET", k_replica(r.id), "slots_free", s.slots_free, "tokens_free", s.tokens_free,
    "in_flight", s.in_flight, "in_flight_tokens", s.in_flight_tokens, "guarded_held", s.guarded_held)
  index_replica(r.id, s)
  local pool = s.pool
  redis.call("HSET", k_ticket(t.id), "granted_to", r.id, "granted_pool", pool, "reserved", reserved,
    "charged_band", t.band, "acked", 0, "credit", credit, "granted_epoch", s.epoch, "guarded", guarded and 1 or 0)
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

-- Enqueue's fast path. When nothing that waits in the ticket's band or above could be placed now (no class
-- with waiting tickets there has room: dispatch would grant this ticket first) and its tenant has nothing
-- waiting in its band, a ticket that can be placed now is granted without entering the queue; the state
-- ends exactly as push + grant would leave it (the tenant lifted to the least active counter, or the
-- band's virtual time when none is active, and charged cost / weight; its flow counters, which would have
-- held this ticket alone, gone again), for a third of the calls. A backlog that cannot be placed (its
-- pool full) so costs a new ticket of another class nothing. The agreement test compares the two bit for bit.
local function backlog_placeable(counts, t, groups)
  for i = 1, BAND_INDEX[t.band] do
    local band = BANDS[i].name
    if counts[band] > 0 then
      if band == t.band and redis.call("ZSCORE", k_active(band), t.tenant) then return true end
      for _, class in ipairs(known_classes()) do
        if redis.call("EXISTS", k_tenant_index(band, class)) == 1 and class_has_room(groups, band, class) then
          return true
        end
      end
    end
  end
  return false
end

local function grant_at_once(t)
  local groups = replica_groups()
  if backlog_placeable(waiting_counts(), t, groups) then return nil end
  local r = choose_replica(groups, t.band, t.cost, t.class)
  if not r then return nil end
  local floor = tonumber(redis.call("HGET", K_VTIME, t.band) or "0")
  local lowest = redis.call("ZRANGE", k_active(t.band), 0, 0, "WITHSCORES")
  if lowest[1] then floor = tonumber(lowest[2]) end
  local before = math.max(counter(t.band, t.tenant), floor)
  redis.call("HSET", K_VTIME, t.band, num(before))
  redis.call("HSET", k_vtc(t.band), t.tenant, num(before + t.cost / t.weight))
  redis.call("HSET", k_ticket(t.id), "entered", NOW)
  return place(t, r)
end

-- candidates compare in the order the reference tries them: tenant (counter, id), flow (counter, id), place
local function candidate_before(a, b)
  if a.score ~= b.score then return a.score < b.score end
  if a.tenant ~= b.tenant then return bytes_less(a.tenant, b.tenant) end
  if a.flow_score ~= b.flow_score then return a.flow_score < b.flow_score end
  if a.flow ~= b.flow then return bytes_less(a.flow, b.flow) end
  return a.t.position < b.t.position
end

-- the tenant's first placeable ticket of `class` (its flows in order); done: nothing of this tenant or
-- after it comes before `bound`
local function tenant_candidate(band, class, groups, bound, tenant, score)
  local flows, start = k_class_flows(band, tenant, class), 0
  while true do
    local page = redis.call("ZRANGE", flows, start, start + 15, "WITHSCORES")
    if not page[1] then return nil, false end
    for i = 1, #page, 2 do
      local head = fifo_head(band, tenant, page[i], class)
      if head then
        local c = {t = ticket_fields(head), score = score, tenant = tenant, flow = page[i],
          flow_score = tonumber(page[i + 1])}
        if bound and not candidate_before(c, bound) then return nil, true end
        c.r = choose_replica(groups, band, c.t.cost, class)
        if c.r then return c, false end
      end
    end
    start = start + 16
  end
end

-- the first candidate of `class` in `band` that can be placed, if it comes before `bound` (the best
-- candidate of another class)
local function first_placeable(band, class, groups, bound)
  local index, start = k_tenant_index(band, class), 0
  while true do
    local page = redis.call("ZRANGE", index, start, start + 15, "WITHSCORES")
    if not page[1] then return nil end
    local next_start = start + 16
    for i = 1, #page, 2 do
      local tenant, score = page[i], tonumber(page[i + 1])
      if bound and (score > bound.score or (score == bound.score and bytes_less(bound.tenant, tenant))) then
        return nil
      end
      if redis.call("EXISTS", k_class_flows(band, tenant, class)) == 0 then
        -- an index entry left behind (never in a sound state): drop it
        redis.call("ZREM", index, tenant)
        next_start = next_start - 1
      else
        local c, done = tenant_candidate(band, class, groups, bound, tenant, score)
        if c then return c end
        if done then return nil end
      end
    end
    start = next_start
  end
end

local function grant_one()
  local bands, counts = {}, waiting_counts()
  for _, band in ipairs(bands_in_order()) do
    if counts[band.name] > 0 then bands[#bands + 1] = band end
  end
  if not bands[1] then return nil end  -- nothing waits: no replica is read
  local groups = replica_groups()
  for _, band in ipairs(bands) do
    local best = nil
    for _, class in ipairs(known_classes()) do
      if class_has_room(groups, band.name, class) then
        best = first_placeable(band.name, class, groups, best) or best
      end
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
