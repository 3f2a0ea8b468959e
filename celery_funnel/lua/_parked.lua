-- _parked.lua: prepended to every parked-task script (park*.lua) by _park.py.
-- KEYS (all eight, always in this order; one hash tag):
--   due          sorted set  task id -> release time (integer µs since the epoch)
--   entries      hash        task id -> the message to publish at release (JSON text)
--   claims       hash        task id -> token of the release that claimed it ("" = none)
--   leases       sorted set  task id -> end of a releaser's claim (µs)
--   accepted     hash        task id -> which copies of the task may run: the token of
--                            its latest release ("<token>"), "+<token>" once a worker
--                            accepted a copy of it, "parked" when parked again after
--                            that; absent while it was never released. And
--                            "origin\0<task id>" -> the origin of the message first
--                            parked under that id (park.lua), kept as long as its record
--   accepted_at  sorted set  task id -> when that last changed (µs), to expire it
--   labels       hash        task id -> the funnel(s) that deferred it
--   counts       hash        label -> how many parked tasks it holds
local due, entries, claims, leases, accepted, accepted_at, labels, counts = unpack(KEYS)

-- the field of `accepted` that keeps the origin of the message first parked as `id`
local function origin_field(id)
  return 'origin\0' .. id
end

local function server_now()
  local clock = redis.call('TIME')
  return clock[1] * 1000000 + clock[2]
end

-- the entry is released, dropped or purged: delete it everywhere, count it out
local function forget(id)
  redis.call('ZREM', due, id)
  redis.call('ZREM', leases, id)
  redis.call('HDEL', entries, id)
  redis.call('HDEL', claims, id)
  local label = redis.call('HGET', labels, id)
  if label then
    redis.call('HDEL', labels, id)
    if redis.call('HINCRBY', counts, label, -1) <= 0 then
      redis.call('HDEL', counts, label)
    end
  end
end

-- a release claims the entry: only copies carrying its token may run; the claim lasts
-- until lease_end (µs), after which a releaser claims it again
local function claim_entry(id, token, now, lease_end)
  redis.call('HSET', accepted, id, token)
  redis.call('ZADD', accepted_at, now, id)
  redis.call('ZREM', due, id)
  redis.call('ZADD', leases, lease_end, id)
  redis.call('HSET', claims, id, token)
end
