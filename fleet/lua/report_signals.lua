-- A replica's engine report (only that replica sends it): its signals, and the granted tickets it received
-- since its last report, whose in-flight credit ends here (the report counts them now). Then dispatch: a
-- report is one of dispatch's triggers (a prefill done, a request finished). A replica the queue does not
-- know (lease lapsed, deregistered) changes nothing, and neither does a ticket granted to an earlier
-- registration of it.
-- Progress: running requests past what their tenants were charged, topped up to what they have served
-- (policies/fairness.py top_up), and their tokens taken from the tenants' token buckets.
-- PAYLOAD: {replica_id, unstarted, unstarted_tokens, running, waiting, kv, received, acked: [ticket ids],
--   progress: [[ticket id, tokens served so far], ...]}
reap()
local p = PAYLOAD
local key = k_replica(p.replica_id)
if redis.call("EXISTS", key) == 1 then
  local acked, acked_tokens = 0, 0
  local epoch = redis.call("HGET", key, "epoch") or ""
  for _, id in ipairs(p.acked) do
    local f = redis.call("HMGET", k_ticket(id), "granted_to", "acked", "credit", "granted_epoch")
    if f[1] == p.replica_id and f[2] ~= "1" and (f[4] or "") == epoch then
      redis.call("HSET", k_ticket(id), "acked", 1)
      acked, acked_tokens = acked + 1, acked_tokens + tonumber(f[3])
    end
  end
  if acked > 0 then
    redis.call("HINCRBY", key, "in_flight", -acked)
    redis.call("HINCRBY", key, "in_flight_tokens", -acked_tokens)
  end
  for _, entry in ipairs(p.progress or {}) do
    local t = ticket_fields(entry[1])
    if t and t.granted_to == p.replica_id and t.granted_epoch == epoch then
      local extra = math.max(0, entry[2] - charged(t))
      if extra > 0 then
        charge(t.charged_band, t.tenant, extra / t.weight)
        charge_flow(t.charged_band, t.tenant, t.flow, extra)
        redis.call("HINCRBY", k_ticket(t.id), "topped", extra)
        rate_settle(t.tenant, t.rpm, t.tpm, extra)
      end
    end
  end
  redis.call("HSET", key, "unstarted", p.unstarted, "unstarted_tokens", p.unstarted_tokens, "running", p.running,
    "waiting", p.waiting, "kv", num(p.kv), "received", p.received, "sig_at", NOW, "fresh", 1)
  redis.call("ZADD", K_SIGNALS, NOW, p.replica_id)
  index_replica(p.replica_id)
end
return reply({grants = dispatch()})
