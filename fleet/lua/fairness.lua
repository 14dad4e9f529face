-- Fairness between flows (policies/fairness.py): token-weighted virtual token counters (VTC). Each tenant
-- has a counter per band; active tenants are tried least first (ties: smallest id, as the sorted set
-- orders members), and the first with a ticket that can be placed goes. A grant charges cost / weight, completion corrects it to actual / weight. A
-- tenant that becomes active is lifted to the smallest active counter (or the band's virtual time), so
-- idle time banks no credit. Flows inside a tenant get a second, unweighted level, kept only while the
-- tenant has waiting work in the band. policies.fairness.in_order is the order of the tenant index
-- (dispatch.lua): tenants with waiting tickets of a class, by counter, one sorted set per class; inside a
-- tenant, its flows with tickets of the class, by flow counter.

local function counter(band, tenant)
  return tonumber(redis.call("HGET", k_vtc(band), tenant) or "0")
end

-- the indexes that order by the counter follow it (the class indexes only where the member is: XX)
local function set_counter(band, tenant, value)
  redis.call("HSET", k_vtc(band), tenant, num(value))
  if redis.call("ZSCORE", k_active(band), tenant) then
    redis.call("ZADD", k_active(band), num(value), tenant)
    for _, class in ipairs(known_classes()) do
      redis.call("ZADD", k_tenant_index(band, class), "XX", num(value), tenant)
    end
  end
end

local function charge(band, tenant, amount)
  set_counter(band, tenant, counter(band, tenant) + amount)
end

-- an idle flow keeps no counter, so only a waiting flow is charged (a client's stream of fresh fairness
-- ids grows no state)
local function charge_flow(band, tenant, flow, amount)
  local flows = k_flows(band, tenant)
  if not redis.call("ZSCORE", flows, flow) then return end
  local value = tonumber(redis.call("HGET", k_flow_vtc(band, tenant), flow) or "0") + amount
  redis.call("HSET", k_flow_vtc(band, tenant), flow, num(value))
  redis.call("ZADD", flows, num(value), flow)
  for _, class in ipairs(known_classes()) do
    redis.call("ZADD", k_class_flows(band, tenant, class), "XX", num(value), flow)
  end
end

-- the flow a ticket joins: the one it asked for, unless that would be one waiting flow too many for its
-- tenant in the band (then the shared overflow flow "~", never a client's fairness id)
local function flow_of(band, tenant, asked)
  local flows = k_flows(band, tenant)
  if redis.call("ZSCORE", flows, asked) or redis.call("ZCARD", flows) < CFG.max_flows then return asked end
  return "~"
end

-- lift `member` of the sorted set `active` (counters in hash `counters`) on activation
local function activate_member(active, counters, member, idle_floor)
  if redis.call("ZSCORE", active, member) then return end
  local floor = idle_floor
  local lowest = redis.call("ZRANGE", active, 0, 0, "WITHSCORES")
  if lowest[1] then floor = tonumber(lowest[2]) end
  local lifted = math.max(tonumber(redis.call("HGET", counters, member) or "0"), floor)
  redis.call("HSET", counters, member, num(lifted))
  redis.call("ZADD", active, num(lifted), member)
end

local function activate(band, tenant, flow)
  activate_member(k_active(band), k_vtc(band), tenant, tonumber(redis.call("HGET", K_VTIME, band) or "0"))
  activate_member(k_flows(band, tenant), k_flow_vtc(band, tenant), flow, 0)
end

-- the flow has nothing waiting any more; the tenant's last flow takes its flow counters with it
local function deactivate_flow(band, tenant, flow)
  local flows = k_flows(band, tenant)
  redis.call("ZREM", flows, flow)
  redis.call("HDEL", k_flow_vtc(band, tenant), flow)
  if redis.call("ZCARD", flows) == 0 then
    redis.call("ZREM", k_active(band), tenant)
    redis.call("DEL", k_flow_vtc(band, tenant))
  end
end

-- the flow has its first waiting ticket of the class: it joins the tenant's flows of that class, and the
-- tenant the class's tenant index (both by counter); leave_class undoes it when the last one goes
local function join_class(band, tenant, flow, class)
  local flow_counter = redis.call("HGET", k_flow_vtc(band, tenant), flow) or "0"
  redis.call("ZADD", k_class_flows(band, tenant, class), flow_counter, flow)
  redis.call("ZADD", k_tenant_index(band, class), num(counter(band, tenant)), tenant)
  add_class(class)
end

local function leave_class(band, tenant, flow, class)
  local flows = k_class_flows(band, tenant, class)
  redis.call("ZREM", flows, flow)
  if redis.call("ZCARD", flows) == 0 then redis.call("ZREM", k_tenant_index(band, class), tenant) end
end

-- a grant: the flow pays its cost (while it still waits), the tenant cost / weight, the band's virtual
-- time moves to the tenant's counter before the charge
local function charge_flow_grant(t) charge_flow(t.band, t.tenant, t.flow, t.cost) end

local function charge_tenant_grant(t)
  local before = counter(t.band, t.tenant)
  redis.call("HSET", K_VTIME, t.band, num(before))
  set_counter(t.band, t.tenant, before + t.cost / t.weight)
end
