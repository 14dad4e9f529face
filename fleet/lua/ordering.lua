-- Order inside a flow (policies/ordering.py): first in, first out; a requeued ticket goes back to the head.

local function fifo_add(band, tenant, flow, id, at_head)
  if at_head then
    redis.call("LPUSH", k_queue(band, tenant, flow), id)
  else
    redis.call("RPUSH", k_queue(band, tenant, flow), id)
  end
end

-- true when the flow's queue is empty afterwards
local function fifo_remove(band, tenant, flow, id)
  local queue = k_queue(band, tenant, flow)
  redis.call("LREM", queue, 1, id)
  return redis.call("LLEN", queue) == 0
end

local function fifo_head(band, tenant, flow) return redis.call("LINDEX", k_queue(band, tenant, flow), 0) end
