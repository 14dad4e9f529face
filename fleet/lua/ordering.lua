-- Order inside a flow (policies/ordering.py): first in, first out; a requeued ticket goes back to the head.
-- Each length class has its own line (a list per flow and class), so a ticket that cannot be placed holds
-- back only later tickets of its class. Positions come from one sequence per namespace (meta "position"):
-- a tail push takes the next number up, a head push the next number down, so comparing two lines' heads
-- by position is comparing their places in the flow.

local function next_position(at_head)
  local n = redis.call("HINCRBY", KEYS[1], "position", 1)
  if at_head then return -n end
  return n
end

-- true when the class's line of the flow was empty before
local function fifo_add(band, tenant, flow, class, id, at_head)
  local line = k_queue(band, tenant, flow, class)
  local length
  if at_head then
    length = redis.call("LPUSH", line, id)
  else
    length = redis.call("RPUSH", line, id)
  end
  return length == 1
end

-- true when the class's line of the flow is empty afterwards
local function fifo_remove(band, tenant, flow, class, id)
  local line = k_queue(band, tenant, flow, class)
  redis.call("LREM", line, 1, id)
  return redis.call("LLEN", line) == 0
end

local function fifo_head(band, tenant, flow, class) return redis.call("LINDEX", k_queue(band, tenant, flow, class), 0) end
