-- Placement (policies/placement.py) among the replicas the gate leaves open: filter -> scorer -> picker.

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
  return a.id < b.id
end

-- picker: the best-scored replica that passes the filter, or nil
local function choose_replica(candidates, cost, class)
  local best = nil
  for _, r in ipairs(candidates) do
    if placement_fits(r, cost, class) and (best == nil or placement_better(r, best, class)) then
      best = r
    end
  end
  return best
end
