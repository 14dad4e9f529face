-- A tenant's rate limits: two token buckets (requests, tokens) refilled continuously, in one hash.
-- Standalone (not prefixed by lib.lua). One atomic step per call, so limits hold across gateway replicas.
--   KEYS[1]  the tenant's bucket hash
--   ARGV[1]  "take" (admit a request of ARGV[5] estimated tokens) or "settle" (add ARGV[5] tokens used
--            beyond the estimate; negative gives tokens back)
--   ARGV[2]  requests per minute, "" when unlimited
--   ARGV[3]  tokens per minute, "" when unlimited
--   ARGV[4]  now in ms, "" for the Redis server's clock
--   ARGV[5]  tokens
-- Returns {admitted (1/0), retry_after_ms}. A request larger than the token bucket passes when the bucket
-- is full (driving it negative), so no request is impossible; the next ones wait for the refill.
local key = KEYS[1]
local rpm = tonumber(ARGV[2])
local tpm = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local tokens = tonumber(ARGV[5])

local state = redis.call("HMGET", key, "requests", "tokens", "at")
local at = tonumber(state[3]) or now
local elapsed = math.max(now - at, 0)
local requests_left, tokens_left
if rpm then requests_left = math.min(rpm, (tonumber(state[1]) or rpm) + elapsed * rpm / 60000) end
if tpm then tokens_left = math.min(tpm, (tonumber(state[2]) or tpm) + elapsed * tpm / 60000) end

local admitted, retry_ms = 1, 0
if ARGV[1] == "take" then
  if rpm and requests_left < 1 then
    admitted, retry_ms = 0, math.ceil((1 - requests_left) * 60000 / rpm)
  end
  if tpm and tokens_left < math.min(tokens, tpm) then
    admitted = 0
    retry_ms = math.max(retry_ms, math.ceil((math.min(tokens, tpm) - tokens_left) * 60000 / tpm))
  end
  if admitted == 1 then
    if rpm then requests_left = requests_left - 1 end
    if tpm then tokens_left = tokens_left - tokens end
  end
elseif tpm then  -- settle
  tokens_left = math.min(tpm, tokens_left - tokens)
end

local fields = {"at", now}
if rpm then fields[#fields + 1] = "requests"; fields[#fields + 1] = string.format("%.17g", requests_left) end
if tpm then fields[#fields + 1] = "tokens"; fields[#fields + 1] = string.format("%.17g", tokens_left) end
redis.call("HSET", key, unpack(fields))
redis.call("PEXPIRE", key, 120000)
return {admitted, retry_ms}
