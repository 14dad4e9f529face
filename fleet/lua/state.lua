-- Shared part of every global-queue script, first of the library (fleet/queue.py LIBRARY): the calling
-- convention, key names, tickets, capacity and leases. The policy seams follow it, one file each
-- (band_order, fairness, ordering, placement, gate), then dispatch. Each file mirrors its module in
-- policies/ function for function, and policies/reference_scheduler.py composes them as dispatch.lua
-- does; a test runs random workloads through both and compares every decision. Keep them in lockstep.
--
-- Calling convention of every script:
--   KEYS     the namespace's fixed keys, in fleet/keys.py DECLARED order (all share one {hash tag})
--   ARGV[1]  JSON config: {"bands": [{"name", "aging_ms", "max_queued", "max_queued_tokens", "max_unstarted_steps",
--            "kv_ceiling"}], "max_grants": n, "bulk_limit": n, "lease_ms": n, "inbox_ttl_ms": n,
--            "signal_stale_ms": n, "clock_step_ms": n, "keys": {family: prefix}}
--   ARGV[2]  now in ms; "" for the queue's clock, from the Redis server's (production: one clock for all
--            gateways); "~<ms>" for the queue's clock from this reading instead of the server's
--   ARGV[3]  the script's own JSON payload
-- Counters are doubles formatted with %.17g so they round-trip exactly (Python floats agree bit for bit).

-- Per-call state: begin_call(keys, argv), at the end of this file, sets it at the start of every call.
-- A script (EVALSHA) defines the whole library anew on every call; a function library (FCALL, Redis 7)
-- defines it once, so these locals outlive a call there and begin_call must set every one of them.
local KEYS, ARGV
-- the decoded config (ARGV[1]), and the string it came from: a function library decodes it again only
-- when it changes (Lua interns strings, so the comparison is one pointer)
local CFG, CFG_SOURCE
local BANDS, BAND_INDEX = {}, {}
local PAYLOAD
-- the ticket this call is about: a grant to it is returned inline, so it is not also pushed to an inbox
local INLINE_TICKET
-- every call does bounded work; one that stops at a bound with work left says so ("more"), and the
-- client calls again (expire) instead of one call holding Redis for long
local MORE = false
local function reply(result)
  result.more = MORE
  return cjson.encode(result)
end

-- the shape of the namespace's state: scripts of another shape must not run on it (its indexes would be
-- wrong); a namespace left by an older release is refused with a clear error
local STATE_VERSION = "3"

-- the queue's clock (policies/clock.py): the server's wall clock, except that it never runs backwards and
-- one step between calls counts at most half a lease, so a paused VM or a clock step drops no live lease
local function queue_time(last_wall, last_now, wall, max_step)
  if last_wall == nil or last_now == nil then return wall end
  return last_now + math.min(math.max(wall - last_wall, 0), max_step)
end

-- NOW: the queue's time. ARGV[2] "" reads the server's wall clock (production), "~<ms>" stands in for that
-- reading (tests of the clock), and any other number is taken as the time itself (tests of the policy).
-- WALL: the wall clock, for display.
local NOW, WALL

local function num(x) return string.format("%.17g", x) end

-- fixed keys (declared), then the data-named families (prefixes from fleet/keys.py)
local K_VTIME, K_QN, K_QT, K_LEASES
local K_REPLICAS, K_STATS, K_SERVED  -- served: tokens charged per tenant
local K_GROUPS, K_CLASSES  -- placement groups -> their replica count; length classes seen
local K_SIGNALS  -- replicas whose engine signals are current, by when they last reported
local K_HELD_OUT  -- replicas a gateway could not reach, by when they may register again
local F
local function k_ticket(id) return F.ticket .. id end
local function k_queue(band, tenant, flow, class) return F.queue .. band .. ":" .. tenant .. "|" .. flow .. "|" .. class end
local function k_active(band) return F.active .. band end
local function k_flows(band, tenant) return F.flows .. band .. ":" .. tenant end
local function k_flow_vtc(band, tenant) return F.flow_vtc .. band .. ":" .. tenant end
local function k_tenant_queued(band) return F.tenant_queued .. band end
local function k_tenant_tokens(band) return F.tenant_tokens .. band end
local function k_vtc(band) return F.vtc .. band end
local function k_wait(band) return F.wait .. band end
local function k_replica(id) return F.replica .. id end
local function k_inbox(owner) return F.inbox .. owner end
local function k_replica_index(group, band) return F.replica_index .. group .. ":" .. band end
local function k_guarded_index(group, band) return F.guarded_index .. group .. ":" .. band end
local function k_guarded_holders(group) return F.guarded_holders .. group end
local function k_packed_index(group, band) return F.packed_index .. group .. ":" .. band end
local function k_spare_replicas(group) return F.spare_replicas .. group end
local function k_tenant_index(band, class) return F.tenant_index .. band .. ":" .. class end
local function k_class_flows(band, tenant, class) return F.class_flows .. band .. ":" .. tenant .. "|" .. class end

-- ids compare byte by byte, as Python compares them and sorted sets order members: Lua's `<` on strings
-- uses the server's locale (strcoll)
local function bytes_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- registered capacity must fit the open index's scores (placement.lua) exactly
local TOKENS_LIMIT = 4294967296  -- 2^32

local function ticket_fields(id)
  local f = redis.call("HMGET", k_ticket(id), "tenant", "band", "cost", "weight", "class", "owner",
    "granted_to", "reserved", "charged_band", "flow", "rpm", "tpm", "acked", "position", "prompt", "credit",
    "ceiling", "asked_flow", "granted_epoch", "guarded", "topped")
  if not f[1] then return nil end
  return {id = id, tenant = f[1], band = f[2], cost = tonumber(f[3]), weight = tonumber(f[4]), class = f[5],
    owner = f[6], granted_to = f[7] or "", reserved = tonumber(f[8] or "0"), charged_band = f[9] or "",
    flow = f[10] or "", rpm = tonumber(f[11] or ""), tpm = tonumber(f[12] or ""), acked = f[13] == "1",
    position = tonumber(f[14] or "0"), prompt = tonumber(f[15] or f[3]), credit = tonumber(f[16] or "0"),
    ceiling = f[17] or "", asked_flow = f[18] or f[10] or "", granted_epoch = f[19] or "", guarded = f[20] == "1",
    topped = tonumber(f[21] or "0")}
end

-- what a ticket's tenant has been charged for it so far: its estimate, and the top-ups while it ran
local function charged(t) return t.cost + t.topped end

-- the length classes tickets have had (read once per call, kept current by add_class)
local CLASSES = nil
local function known_classes()
  if CLASSES == nil then CLASSES = redis.call("SMEMBERS", K_CLASSES) end
  return CLASSES
end

local function add_class(class)
  if redis.call("SADD", K_CLASSES, class) == 1 then CLASSES = nil end
end

-- tickets waiting per band (read once per call, kept current by count_waiting)
local COUNTS = nil
local function waiting_counts()
  if COUNTS == nil then
    local names = {}
    for i, band in ipairs(BANDS) do names[i] = band.name end
    local values = redis.call("HMGET", K_QN, unpack(names))
    COUNTS = {}
    for i, name in ipairs(names) do COUNTS[name] = tonumber(values[i] or "0") end
  end
  return COUNTS
end

-- the ticket's place in its band's bookkeeping (depth per band and tenant, the aging index)
local function count_waiting(t, band, sign)
  local counts = waiting_counts()
  counts[band] = counts[band] + sign
  redis.call("HINCRBY", K_QN, band, sign)
  redis.call("HINCRBY", K_QT, band, sign * t.cost)
  if sign > 0 then
    redis.call("HINCRBY", k_tenant_queued(band), t.tenant, 1)
    redis.call("HINCRBY", k_tenant_tokens(band), t.tenant, t.cost)
  elseif redis.call("HINCRBY", k_tenant_queued(band), t.tenant, -1) <= 0 then
    redis.call("HDEL", k_tenant_queued(band), t.tenant)
    redis.call("HDEL", k_tenant_tokens(band), t.tenant)
  else
    redis.call("HINCRBY", k_tenant_tokens(band), t.tenant, -t.cost)
  end
end

local function delete_ticket(t)
  redis.call("DEL", k_ticket(t.id))
  redis.call("ZREM", K_LEASES, t.id)
end

-- Start a call: keys, arguments, config, the namespace's version check and the queue's clock. Returns an
-- error reply to return at once, or nil.
local function begin_call(keys, argv)
  KEYS, ARGV = keys, argv
  if argv[1] ~= CFG_SOURCE then
    CFG, CFG_SOURCE = cjson.decode(argv[1]), argv[1]
    BANDS, BAND_INDEX = {}, {}
    for i, band in ipairs(CFG.bands) do
      BANDS[i] = band
      BAND_INDEX[band.name] = i
    end
    F = CFG.keys
  end
  PAYLOAD = cjson.decode(argv[3])
  INLINE_TICKET = PAYLOAD.ticket_id or ""
  MORE, CLASSES, COUNTS = false, nil, nil
  K_VTIME, K_QN, K_QT, K_LEASES = keys[2], keys[3], keys[4], keys[5]
  K_REPLICAS, K_STATS, K_SERVED = keys[6], keys[7], keys[8]
  K_GROUPS, K_CLASSES, K_SIGNALS, K_HELD_OUT = keys[9], keys[10], keys[11], keys[12]

  local meta = redis.call("HMGET", keys[1], "version", "clock_wall", "clock_now")
  local version = meta[1]
  if not version then
    if redis.call("EXISTS", keys[5], keys[6]) > 0 then
      return redis.error_reply("fleetgate: this queue namespace holds state from an older release; " ..
        "use a new queue.namespace (or delete its keys) for this one")
    end
    redis.call("HSET", keys[1], "version", STATE_VERSION)
  elseif version ~= STATE_VERSION then
    return redis.error_reply("fleetgate: this queue namespace holds state of version " .. version ..
      "; this release uses version " .. STATE_VERSION)
  end

  local clock_arg = argv[2] or ""
  if clock_arg ~= "" and string.sub(clock_arg, 1, 1) ~= "~" then
    NOW = tonumber(clock_arg)
    WALL = NOW
  else
    if clock_arg ~= "" then
      WALL = tonumber(string.sub(clock_arg, 2))
    else
      local t = redis.call("TIME")
      WALL = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    NOW = queue_time(tonumber(meta[2] or ""), tonumber(meta[3] or ""), WALL, CFG.clock_step_ms)
    redis.call("HSET", keys[1], "clock_wall", num(WALL), "clock_now", num(NOW))
  end
  return nil
end
