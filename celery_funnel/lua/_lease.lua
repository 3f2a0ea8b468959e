-- _lease.lua: prepended to every lease script (lease_*.lua) by _leases.py.
-- A concurrency funnel is three keys under one hash tag, always given in this order:
--   holders  sorted set  task id -> end of its lease (integer µs since the epoch)
--   info     hash        task id -> "<token>|<worker>|<started µs>" for a running task,
--                        "" for a slot handed to a parked waiter not yet arrived
--   waiters  sorted set  task id -> rank * 10^13 + arrival (ms): parked tasks waiting
--                        for a slot, the broker's priority first (rank 0..255), then
--                        arrival (exact in a double: below 2^53)
-- Units: µs from the server's TIME; ttl in µs; n = the funnel's concurrency.

local function server_now()
  local clock = redis.call('TIME')
  return clock[1] * 1000000 + clock[2]
end

local promoted = {}  -- {funnel index, task id} of each waiter handed a slot

-- leases that ran out (their worker died or lost Redis) free their slots; at most
-- 100 per call: bounded work
local function expire(holders, info, now)
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now, 'LIMIT', 0, 100)
  for _, id in ipairs(gone) do
    redis.call('ZREM', holders, id)
    redis.call('HDEL', info, id)
  end
end

-- free slots of funnel number `at` go to its first waiters, the most urgent then the
-- oldest: each
-- gets its slot (held for ttl until it arrives) and is returned, to be published at
-- once. Waiters holding a slot already number at most n: 2n entries are read at most.
local function promote(at, holders, info, waiters, n, now, ttl)
  local free = n - redis.call('ZCARD', holders)
  if free <= 0 then
    return
  end
  for _, id in ipairs(redis.call('ZRANGE', waiters, 0, n + free - 1)) do
    if free <= 0 then
      break
    end
    if not redis.call('ZSCORE', holders, id) then
      redis.call('ZADD', holders, now + ttl, id)
      redis.call('HSET', info, id, '')
      promoted[#promoted + 1] = {at, id}
      free = free - 1
    end
  end
end

-- whether the holder entry `held` belongs to `token` ("*": any; "": a handed slot)
local function owns(held, token)
  if not held then
    return false
  end
  if token == '*' or held == token then
    return true
  end
  return token ~= '' and string.sub(held, 1, #token + 1) == token .. '|'
end

-- the items of list `items` appended to `reply`; returns it
local function extend(reply, items)
  for _, item in ipairs(items) do
    reply[#reply + 1] = item
  end
  return reply
end

-- "<funnel index>:<task id>" of each waiter handed a slot (but task `skip`) appended
-- to `reply`; returns it
local function extend_promoted(reply, skip)
  for _, pair in ipairs(promoted) do
    if pair[2] ~= skip then
      reply[#reply + 1] = pair[1] .. ':' .. pair[2]
    end
  end
  return reply
end
