-- A tenant's rate limits: two token buckets (requests, tokens per minute) refilled continuously, in one
-- hash per tenant. Taken at enqueue by the request's estimate, settled at completion to what it served,
-- given back when a waiting ticket is withdrawn: all inside the queue's own steps, so the limits hold
-- across every gateway and cost no round trip of their own. (The reference scheduler models scheduling,
-- not quotas: this file has no mirror there.) A request larger than the token bucket passes when the
-- bucket is full (driving it negative), so no request is impossible; the next ones wait for the refill.

local function k_rate(tenant) return F.rate .. tenant end

-- the buckets' levels now: requests_left, tokens_left (nil for an unlimited bucket)
local function rate_levels(key, rpm, tpm)
  local state = redis.call("HMGET", key, "requests", "tokens", "at")
  local elapsed = math.max(NOW - (tonumber(state[3]) or NOW), 0)
  local requests_left, tokens_left
  if rpm then requests_left = math.min(rpm, (tonumber(state[1]) or rpm) + elapsed * rpm / 60000) end
  if tpm then tokens_left = math.min(tpm, (tonumber(state[2]) or tpm) + elapsed * tpm / 60000) end
  return requests_left, tokens_left
end

local function rate_store(key, rpm, tpm, requests_left, tokens_left)
  local fields = {"at", NOW}
  if rpm then fields[#fields + 1] = "requests"; fields[#fields + 1] = num(requests_left) end
  if tpm then fields[#fields + 1] = "tokens"; fields[#fields + 1] = num(tokens_left) end
  redis.call("HSET", key, unpack(fields))
  redis.call("PEXPIRE", key, 120000)
end

-- take one request of `tokens` estimated tokens: 0, 0 when admitted, else the ms until it could be and the
-- ms until any request could be (the request bucket's wait, or the token bucket's until it holds a token)
local function rate_take(tenant, rpm, tpm, tokens)
  if not rpm and not tpm then return 0, 0 end
  local key = k_rate(tenant)
  local requests_left, tokens_left = rate_levels(key, rpm, tpm)
  local retry_ms, held_ms = 0, 0
  if rpm and requests_left < 1 then retry_ms = math.ceil((1 - requests_left) * 60000 / rpm); held_ms = retry_ms end
  if tpm and tokens_left < math.min(tokens, tpm) then
    retry_ms = math.max(retry_ms, math.ceil((math.min(tokens, tpm) - tokens_left) * 60000 / tpm))
    if tokens_left < 1 then held_ms = math.max(held_ms, math.ceil((1 - tokens_left) * 60000 / tpm)) end
  end
  if retry_ms > 0 then return retry_ms, held_ms end
  rate_store(key, rpm, tpm, rpm and requests_left - 1, tpm and tokens_left - tokens)
  return 0, 0
end

-- charge `tokens` beyond what was taken (negative gives tokens back)
local function rate_settle(tenant, rpm, tpm, tokens)
  if not tpm or tokens == 0 then return end
  local key = k_rate(tenant)
  local requests_left, tokens_left = rate_levels(key, rpm, tpm)
  rate_store(key, rpm, tpm, requests_left, math.min(tpm, tokens_left - tokens))
end
