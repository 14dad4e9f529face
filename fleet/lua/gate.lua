-- The gate (policies/gate.py): whether a replica may be granted more of a band's work now. Pending work is
-- what it has not started: the unstarted requests its engine last reported plus the grants it has not
-- acknowledged (in flight). While its signals are current, a band's tickets go to it only while its
-- pending work is below the band's max_unstarted and its KV usage below the band's kv_ceiling (and it has
-- a free slot); with stale signals, only the concurrency cap applies (a free slot), and pending work is
-- every grant it holds. Signals go stale in reap (dispatch.lua), bounded per call as the reference does.

local function replica_pending(r)
  if r.fresh then return r.unstarted + r.in_flight end
  return r.slots_total - r.slots_free
end

local function gate_open(r, band)
  if r.slots_free < 1 then return false end
  if not r.fresh then return true end
  return replica_pending(r) < band.max_unstarted and r.kv < band.kv_ceiling
end
