-- Placement (policies/placement.py) among the replicas the gate leaves open: filter -> scorer -> picker.
-- Replicas are indexed by placement group (state.lua), so the picker reads each group's best first
-- instead of every replica.

-- filter: the replica runs the class, and has the tokens (an idle replica takes any ticket it accepts)
local function placement_fits(r, cost, class)
  return r.accepts[class] == true and (r.tokens_free >= cost or r.slots_free == r.slots_total)
end

-- scorer, as an order: a replica preferring the class, most free slots, most free tokens, smallest id
local function placement_better(a, b, class)
  local pa, pb = a.prefers[class] == true, b.prefers[class] == true
  if pa ~= pb then return pa end
  if a.slots_free ~= b.slots_free then return a.slots_free > b.slots_free end
  if a.tokens_free ~= b.tokens_free then return a.tokens_free > b.tokens_free end
  return bytes_less(a.id, b.id)
end

-- the placement groups, each with whether its best replica has a free slot
local function replica_groups()
  local groups = {}
  for _, name in ipairs(redis.call("SMEMBERS", K_GROUPS)) do
    local accepts, prefers = string.match(name, "^([^|]*)|(.*)$")
    local g = {name = name, accepts = {}, prefers = {}, has_room = false}
    for class in string.gmatch(accepts, "[^,]+") do g.accepts[class] = true end
    for class in string.gmatch(prefers, "[^,]+") do g.prefers[class] = true end
    local index = k_replica_index(name)
    while true do
      local top = redis.call("ZRANGE", index, 0, 0)[1]
      if not top then break end
      local free = redis.call("HGET", k_replica(top), "slots_free")
      if free then
        g.has_room = tonumber(free) >= 1
        break
      end
      redis.call("ZREM", index, top)  -- a replica gone without leaving its index (never in a sound state)
    end
    groups[#groups + 1] = g
  end
  return groups
end

local function class_has_room(groups, class)
  for _, g in ipairs(groups) do
    if g.has_room and g.accepts[class] then return true end
  end
  return false
end

-- one group's best replica for the ticket: its replicas come best-scored first, so the first one the
-- gate leaves open and the filter passes
local function best_in_group(g, cost, class)
  local index, start = k_replica_index(g.name), 0
  while true do
    local page = redis.call("ZRANGE", index, start, start + 7)
    if not page[1] then return nil end
    for _, id in ipairs(page) do
      local f = redis.call("HMGET", k_replica(id), "slots_free", "tokens_free", "slots_total")
      if not f[1] then return nil end  -- gone without leaving its index: replica_groups drops it next time
      local r = {id = id, slots_free = tonumber(f[1]), tokens_free = tonumber(f[2]), slots_total = tonumber(f[3]),
        accepts = g.accepts, prefers = g.prefers}
      if r.slots_free < 1 then return nil end  -- none further down has a slot
      if gate_open(r) and placement_fits(r, cost, class) then return r end
    end
    start = start + 8
  end
end

-- picker: the best-scored replica over every group, or nil
local function choose_replica(groups, cost, class)
  local best = nil
  for _, g in ipairs(groups) do
    if g.has_room and g.accepts[class] then
      local r = best_in_group(g, cost, class)
      if r and (best == nil or placement_better(r, best, class)) then best = r end
    end
  end
  return best
end
