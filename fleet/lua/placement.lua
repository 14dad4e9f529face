-- Placement (policies/placement.py) among the replicas the gate leaves open: filter -> scorer -> picker.
--
-- The open index: each placement group (its accepted, preferred and guarded classes, "long,short|short|long")
-- has one sorted set per band holding the group's replicas that the gate leaves open to that band, scored
-- as the scorer orders them: holding no guarded work first, then least pending work, then most free slots
-- (equal scores order by id). A group that guards a class has two more sorted sets per band: the guarded
-- index, those of its open replicas that may take guarded work now (takes_guarded), scored the same; and the
-- packed index, every open replica again with the fewest free slots first, which the group's own classes are
-- placed from while a replica of it holds guarded work (it packs). Such a group also keeps the set of its
-- replicas that hold no work (its spares, for its reserve) and of those holding guarded work. Every change
-- to a replica's state re-indexes it (index_replica), so the picker reads each group's best first instead of
-- every replica, and a class no replica of a group may take skips that group whole. The replica hash keeps
-- the values themselves.

local PENDING_UNIT = 1048576  -- 2^20 > slots (< 2^19): scores order by pending work, then by free slots
local GUARDED_UNIT = 4503599627370496  -- 2^52 > pending work x PENDING_UNIT: holding guarded work ranks last
-- (pending tokens < 2^32, so a score stays below 2^53, an exact double)
local function open_score(holds_guarded, pending, slots_free)
  return (holds_guarded and GUARDED_UNIT or 0) + pending * PENDING_UNIT - slots_free
end
-- the packed index's score: the same, but the fewest free slots first
local function packed_score(holds_guarded, pending, slots_free)
  return (holds_guarded and GUARDED_UNIT or 0) + pending * PENDING_UNIT + slots_free
end

-- what the gate and the index need of a replica, in one read
local function replica_state(id)
  local f = redis.call("HMGET", k_replica(id), "slots_total", "slots_free", "tokens_total", "tokens_free",
    "group", "in_flight_tokens", "unstarted_tokens", "kv", "fresh", "step_tokens", "in_flight", "prefill_chunk",
    "pool", "epoch", "guarded_held", "reserve")
  if not f[1] then return nil end
  return {id = id, slots_total = tonumber(f[1]), slots_free = tonumber(f[2]), tokens_total = tonumber(f[3]),
    tokens_free = tonumber(f[4]), group = f[5], in_flight_tokens = tonumber(f[6] or "0"),
    unstarted_tokens = tonumber(f[7] or "0"), kv = tonumber(f[8] or "0"), fresh = f[9] == "1",
    step_tokens = tonumber(f[10] or "2048"), in_flight = tonumber(f[11] or "0"),
    prefill_chunk = tonumber(f[12] or "0"), pool = f[13] or "default", epoch = f[14] or "",
    guarded_held = tonumber(f[15] or "0"), reserve = tonumber(f[16] or "0")}
end

-- a group guards a class when its name's last part ("accepts|prefers|guarded") is not empty
local function group_guards(group) return string.sub(group, -1) ~= "|" end

-- whether the replica may take work of a class it guards: it holds none of the work it is built for, and
-- what it has not started fits in one step
local function takes_guarded(r, pending)
  return r.slots_total - r.slots_free <= r.guarded_held and pending <= r.step_tokens
end

-- the replica is in the index of every band the gate leaves it open to, and in no other; in its group's
-- guarded index of those bands while it may take guarded work (``r``: its state as just written, or read
-- afresh)
local function index_replica(id, r)
  r = r or replica_state(id)
  local guards = group_guards(r.group)
  if guards then  -- the group's holders of guarded work (it packs) and its spares (its reserve); idempotent
    redis.call(r.guarded_held > 0 and "SADD" or "SREM", k_guarded_holders(r.group), id)
    redis.call(r.slots_free == r.slots_total and "SADD" or "SREM", k_spare_replicas(r.group), id)
  end
  local pending = replica_pending(r)
  local score = open_score(r.guarded_held > 0, pending, r.slots_free)
  local packed = packed_score(r.guarded_held > 0, pending, r.slots_free)
  local takes = guards and takes_guarded(r, pending)
  for _, band in ipairs(BANDS) do
    local open = gate_open(r, band)
    if open then
      redis.call("ZADD", k_replica_index(r.group, band.name), score, id)
    else
      redis.call("ZREM", k_replica_index(r.group, band.name), id)
    end
    if open and guards then
      redis.call("ZADD", k_packed_index(r.group, band.name), packed, id)
    elseif guards then
      redis.call("ZREM", k_packed_index(r.group, band.name), id)
    end
    if open and takes then
      redis.call("ZADD", k_guarded_index(r.group, band.name), score, id)
    elseif guards then
      redis.call("ZREM", k_guarded_index(r.group, band.name), id)
    end
  end
end

local function unindex_replica(id, group)
  redis.call("SREM", k_guarded_holders(group), id)
  redis.call("SREM", k_spare_replicas(group), id)
  for _, band in ipairs(BANDS) do
    redis.call("ZREM", k_replica_index(group, band.name), id)
    redis.call("ZREM", k_guarded_index(group, band.name), id)
    redis.call("ZREM", k_packed_index(group, band.name), id)
  end
  if redis.call("HINCRBY", K_GROUPS, group, -1) <= 0 then redis.call("HDEL", K_GROUPS, group) end
end

-- a pool that names no preference prefers every class it accepts
local function group_prefers(g, class) return g.any_preference == false or g.prefers[class] == true end

-- keeps_reserve: taking guarded work leaves the group its reserve of empty replicas (one already holding
-- guarded work changes nothing; without a reserve there is nothing to keep, so nothing is read).
-- ``spare_in_group()`` reads the group's count of replicas holding no work.
local function keeps_reserve(r, spare_in_group)
  return r.guarded_held > 0 or r.reserve == 0 or spare_in_group() - 1 >= r.reserve
end

-- filter: the replica runs the class; a guarded class only while it may take guarded work and its group
-- keeps its reserve; and it has the tokens (an idle replica takes any ticket it accepts)
local function placement_fits(r, cost, class, spare_in_group)
  if not r.accepts[class] then return false end
  if r.guarded[class] and not takes_guarded(r, r.pending) then return false end
  if r.guarded[class] and not keeps_reserve(r, spare_in_group) then return false end
  return r.tokens_free >= cost or r.slots_free == r.slots_total
end

-- how many of the group's registered replicas hold no work now, and whether one holds guarded work (a grant
-- may change either, so they are read afresh for each placement)
local function group_spare(g) return redis.call("SCARD", k_spare_replicas(g.name)) end
local function group_packs(g) return group_guards(g.name) and redis.call("SCARD", k_guarded_holders(g.name)) > 0 end

-- scorer, as an order: a replica preferring the class, holding no guarded work, least pending work, most
-- free slots (fewest where its group packs the class: ``slot_key`` is then +slots_free, else -slots_free),
-- smallest id
local function placement_better(a, b)
  if a.preferred ~= b.preferred then return a.preferred end
  if a.holds_guarded ~= b.holds_guarded then return not a.holds_guarded end
  if a.pending ~= b.pending then return a.pending < b.pending end
  if a.slot_key ~= b.slot_key then return a.slot_key < b.slot_key end
  return bytes_less(a.id, b.id)
end

-- the placement groups (each group's best score per band is read when first needed)
local function replica_groups()
  local groups = {}
  for _, name in ipairs(redis.call("HKEYS", K_GROUPS)) do
    local accepts, prefers, guarded = string.match(name, "^([^|]*)|([^|]*)|(.*)$")
    local g = {name = name, accepts = {}, prefers = {}, guarded = {}, any_preference = false, any_open = {},
      any_guarded_open = {}}
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

-- the sorted set a class's tickets are placed from: the group's guarded index for a class it guards, its
-- packed index for another while it packs (``packs``; the two hold the same replicas, in another order)
local function class_index(g, band, class, packs)
  if g.guarded[class] then return k_guarded_index(g.name, band) end
  if packs then return k_packed_index(g.name, band) end
  return k_replica_index(g.name, band)
end

-- whether the group may have a replica for the class in the band: that class's index of the band is not
-- empty (read once per call and group)
local function group_may_take(g, band, class)
  if not g.accepts[class] then return false end
  local seen = g.guarded[class] and g.any_guarded_open or g.any_open
  if seen[band] == nil then seen[band] = redis.call("ZCARD", class_index(g, band, class)) > 0 end
  return seen[band]
end

local function class_has_room(groups, band, class)
  for _, g in ipairs(groups) do
    if group_may_take(g, band, class) then return true end
  end
  return false
end

-- one group's best replica for the ticket: the class's index comes best-scored first, so the first one the
-- filter passes
local function best_in_group(g, band, cost, class)
  local preferred = group_prefers(g, class)
  local packs = not g.guarded[class] and group_packs(g)
  local index, start = class_index(g, band, class, packs), 0
  local spare  -- read once for this placement, and only if a candidate's reserve needs it
  local function spare_in_group()
    if spare == nil then spare = group_spare(g) end
    return spare
  end
  while true do
    local page = redis.call("ZRANGE", index, start, start + 7, "WITHSCORES")
    if not page[1] then return nil end
    local next_start = start + 8
    for i = 1, #page, 2 do
      local id, score = page[i], tonumber(page[i + 1])
      local f = redis.call("HMGET", k_replica(id), "slots_free", "tokens_free", "slots_total", "guarded_held",
        "step_tokens", "reserve")
      if f[1] then
        local slots_free = tonumber(f[1])
        local unit_score = packs and score - slots_free or score + slots_free
        local holds_guarded = unit_score >= GUARDED_UNIT
        if holds_guarded then unit_score = unit_score - GUARDED_UNIT end
        local r = {id = id, slots_free = slots_free, tokens_free = tonumber(f[2]), slots_total = tonumber(f[3]),
          guarded_held = tonumber(f[4] or "0"), step_tokens = tonumber(f[5] or "2048"),
          reserve = tonumber(f[6] or "0"), pending = unit_score / PENDING_UNIT, holds_guarded = holds_guarded,
          accepts = g.accepts, guarded = g.guarded, preferred = preferred,
          slot_key = packs and slots_free or -slots_free}
        if placement_fits(r, cost, class, spare_in_group) then return r end
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
