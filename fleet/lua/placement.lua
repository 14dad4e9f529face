-- Placement (policies/placement.py) among the replicas the gate leaves open: filter -> scorer -> picker.
--
-- The open index: each placement group (its accepted, preferred and guarded classes, "long,short|short|long")
-- has one sorted set per band holding the group's replicas that the gate leaves open to that band, scored
-- as the scorer orders them: least pending work, then most free slots (equal scores order by id). Every
-- change to a replica's state re-indexes it (index_replica), so the picker reads each group's best first
-- instead of every replica, and a group whose best has pending work is skipped whole for its guarded
-- classes. The replica hash keeps the values themselves.

local PENDING_UNIT = 1048576  -- 2^20 > slots (< 2^19): scores order by pending work, then by free slots
-- (pending tokens < 2^32, so a score stays an exact double)
local function open_score(pending, slots_free) return pending * PENDING_UNIT - slots_free end

-- what the gate and the index need of a replica, in one read
local function replica_state(id)
  local f = redis.call("HMGET", k_replica(id), "slots_total", "slots_free", "tokens_total", "tokens_free",
    "group", "in_flight_tokens", "unstarted_tokens", "kv", "fresh", "step_tokens", "in_flight", "prefill_chunk",
    "pool", "epoch")
  if not f[1] then return nil end
  return {id = id, slots_total = tonumber(f[1]), slots_free = tonumber(f[2]), tokens_total = tonumber(f[3]),
    tokens_free = tonumber(f[4]), group = f[5], in_flight_tokens = tonumber(f[6] or "0"),
    unstarted_tokens = tonumber(f[7] or "0"), kv = tonumber(f[8] or "0"), fresh = f[9] == "1",
    step_tokens = tonumber(f[10] or "2048"), in_flight = tonumber(f[11] or "0"),
    prefill_chunk = tonumber(f[12] or "0"), pool = f[13] or "default", epoch = f[14] or ""}
end

-- the replica is in the index of every band the gate leaves it open to, and in no other (``r``: its state
-- as just written, or read afresh)
local function index_replica(id, r)
  r = r or replica_state(id)
  local score = open_score(replica_pending(r), r.slots_free)
  for _, band in ipairs(BANDS) do
    if gate_open(r, band) then
      redis.call("ZADD", k_replica_index(r.group, band.name), score, id)
    else
      redis.call("ZREM", k_replica_index(r.group, band.name), id)
    end
  end
end

local function unindex_replica(id, group)
  for _, band in ipairs(BANDS) do redis.call("ZREM", k_replica_index(group, band.name), id) end
  if redis.call("HINCRBY", K_GROUPS, group, -1) <= 0 then redis.call("HDEL", K_GROUPS, group) end
end

-- a pool that names no preference prefers every class it accepts
local function group_prefers(g, class) return g.any_preference == false or g.prefers[class] == true end

-- filter: the replica runs the class; a guarded class only while nothing is pending there; and it has the
-- tokens (an idle replica takes any ticket it accepts)
local function placement_fits(r, cost, class)
  if not r.accepts[class] then return false end
  if r.guarded[class] and r.pending > 0 then return false end
  return r.tokens_free >= cost or r.slots_free == r.slots_total
end

-- scorer, as an order: a replica preferring the class, least pending work, most free slots, smallest id
local function placement_better(a, b)
  if a.preferred ~= b.preferred then return a.preferred end
  if a.pending ~= b.pending then return a.pending < b.pending end
  if a.slots_free ~= b.slots_free then return a.slots_free > b.slots_free end
  return bytes_less(a.id, b.id)
end

-- the placement groups (each group's best score per band is read when first needed)
local function replica_groups()
  local groups = {}
  for _, name in ipairs(redis.call("HKEYS", K_GROUPS)) do
    local accepts, prefers, guarded = string.match(name, "^([^|]*)|([^|]*)|(.*)$")
    local g = {name = name, accepts = {}, prefers = {}, guarded = {}, any_preference = false, top = {}}
    for class in string.gmatch(accepts, "[^,]+") do g.accepts[class] = true end
    for class in string.gmatch(prefers, "[^,]+") do
      g.prefers[class] = true
      g.any_preference = true
    end
    for class in string.gmatch(guarded, "[^,]+") do g.guarded[class] = true end
    groups[#groups + 1] = g
  end
  return groups
end

-- whether the group may have a replica for the class in the band: one is open to the band and, for a
-- guarded class, has nothing pending (score <= 0)
local function group_may_take(g, band, class)
  if not g.accepts[class] then return false end
  local top = g.top[band]
  if top == nil then
    local first = redis.call("ZRANGE", k_replica_index(g.name, band), 0, 0, "WITHSCORES")
    top = first[1] and tonumber(first[2]) or false
    g.top[band] = top
  end
  return top ~= false and (not g.guarded[class] or top <= 0)
end

local function class_has_room(groups, band, class)
  for _, g in ipairs(groups) do
    if group_may_take(g, band, class) then return true end
  end
  return false
end

-- one group's best replica for the ticket: its open replicas come best-scored first, so the first one the
-- filter passes (for a guarded class, only those with nothing pending are looked at)
local function best_in_group(g, band, cost, class)
  local preferred, guarded = group_prefers(g, class), g.guarded[class] == true
  local index, start = k_replica_index(g.name, band), 0
  while true do
    local page = redis.call("ZRANGE", index, start, start + 7, "WITHSCORES")
    if not page[1] then return nil end
    local next_start = start + 8
    for i = 1, #page, 2 do
      local id, score = page[i], tonumber(page[i + 1])
      if guarded and score > 0 then return nil end
      local f = redis.call("HMGET", k_replica(id), "slots_free", "tokens_free", "slots_total")
      if f[1] then
        local slots_free = tonumber(f[1])
        local r = {id = id, slots_free = slots_free, tokens_free = tonumber(f[2]), slots_total = tonumber(f[3]),
          pending = (score + slots_free) / PENDING_UNIT, accepts = g.accepts, guarded = g.guarded,
          preferred = preferred}
        if placement_fits(r, cost, class) then return r end
      else  -- gone without leaving the index (never in a sound state): drop it
        redis.call("ZREM", index, id)
        next_start = next_start - 1
      end
    end
    start = next_start
  end
end

-- picker: the best-scored replica open to the band over every group, or nil
local function choose_replica(groups, band, cost, class)
  local best = nil
  for _, g in ipairs(groups) do
    if group_may_take(g, band, class) then
      local r = best_in_group(g, band, cost, class)
      if r and (best == nil or placement_better(r, best)) then best = r end
    end
  end
  return best
end
