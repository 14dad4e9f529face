-- The gate (policies/gate.py): whether a replica may be granted more of a band's work now. Pending work is
-- the prompt tokens it has not started (each request up to its engine's prefill chunk): those its engine
-- last reported unstarted plus those of the grants it has not acknowledged (in flight). While its signals are current, a band's tickets go to it only while
-- its pending work is below the band's max_unstarted_steps times its step budget and its KV usage below the
-- band's kv_ceiling (and it has a free slot); with stale signals, only the concurrency cap applies (a free
-- slot), and pending work is the tokens its grants reserve. Signals go stale in reap (dispatch.lua),
-- bounded per call as the reference does.

local function replica_pending(r)
  if r.fresh then return r.unstarted_tokens + r.in_flight_tokens end
  return r.tokens_total - r.tokens_free
end

local function gate_open(r, band)
  if r.slots_free < 1 then return false end
  if not r.fresh then return true end
  return replica_pending(r) < band.max_unstarted_steps * r.step_tokens and r.kv < band.kv_ceiling
end
