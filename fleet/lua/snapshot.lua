-- Read-only view for status, metrics and tests. PAYLOAD: {}
local bands = {}
for _, band in ipairs(BANDS) do
  local counters = {}
  local flat = redis.call("HGETALL", k_vtc(band.name))
  for i = 1, #flat, 2 do counters[flat[i]] = flat[i + 1] end
  local active = redis.call("ZRANGE", k_active(band.name), 0, -1)
  local tenants = {}
  local depth = redis.call("HGETALL", k_tenant_queued(band.name))
  for i = 1, #depth, 2 do
    tenants[depth[i]] = {queued = tonumber(depth[i + 1]),
      queued_tokens = tonumber(redis.call("HGET", k_tenant_tokens(band.name), depth[i]) or "0")}
  end
  bands[#bands + 1] = {name = band.name, counters = counters, active = active, tenants = tenants,
    max_unstarted_steps = band.max_unstarted_steps, kv_ceiling = band.kv_ceiling,
    queued = tonumber(redis.call("HGET", K_QN, band.name) or "0"),
    queued_tokens = tonumber(redis.call("HGET", K_QT, band.name) or "0")}
end
local replicas = {}
local ids = redis.call("ZRANGE", K_REPLICAS, 0, -1, "WITHSCORES")
for i = 1, #ids, 2 do
  local r = redis.call("HMGET", k_replica(ids[i]), "accepts", "pool", "prefers", "running", "waiting",
    "received", "sig_at", "in_flight", "unstarted")
  local state = replica_state(ids[i])
  local open = {}
  for _, band in ipairs(BANDS) do
    if gate_open(state, band) then open[#open + 1] = band.name end
  end
  replicas[#replicas + 1] = {replica_id = ids[i], expires_ms = tonumber(ids[i + 1]),
    slots_total = state.slots_total, slots_free = state.slots_free, tokens_total = state.tokens_total,
    tokens_free = state.tokens_free, accepts = r[1], pool = r[2], prefers = r[3],
    fresh = state.fresh, pending = replica_pending(state), in_flight = tonumber(r[8] or "0"),
    in_flight_tokens = state.in_flight_tokens, unstarted = tonumber(r[9] or "0"),
    unstarted_tokens = state.unstarted_tokens, step_tokens = state.step_tokens,
    running = tonumber(r[4] or "0"), waiting = tonumber(r[5] or "0"),
    kv_usage = state.kv, received = tonumber(r[6] or "0"), signals_at_ms = tonumber(r[7] or "0"),
    guarded_held = state.guarded_held, reserve = state.reserve, open_bands = open}
end
local served = {}
local served_flat = redis.call("HGETALL", K_SERVED)
for i = 1, #served_flat, 2 do served[served_flat[i]] = tonumber(served_flat[i + 1]) end
local stats = {}
local flat = redis.call("HGETALL", K_STATS)
for i = 1, #flat, 2 do stats[flat[i]] = tonumber(flat[i + 1]) end
return reply({now_ms = NOW, wall_ms = WALL, bands = bands, replicas = replicas, stats = stats, served = served,
  tickets = redis.call("ZCARD", K_LEASES)})
