-- _concurrency.lua: prepended to every concurrency script (concurrency_*.lua) by
-- _stores/concurrency.py.
-- A concurrency funnel is three keys under one hash tag, always given in this order:
--   holders  sorted set  task id -> end of its lease (integer µs since the epoch)
--   info     hash        task id -> "<token>|<worker>|<started µs>" for a running task,
--                        "" for a seat handed to a parked waiter not yet arrived
--   waiters  sorted set  task id -> rank * 10^13 + arrival (ms): tasks waiting for a
--                        seat, the broker's priority first (rank 0..255), then arrival
--                        (exact in a double: below 2^53); one arriving in the same ms
--                        as an earlier one of its rank is placed after it
--   info also holds "held:<task id>" -> "<channel>|<until µs>" for a waiter held in
--   its worker (not parked): told on its worker's pub/sub channel when handed a seat,
--   and dropped from the queue once its mark ends (its worker died: marks are renewed
--   at each of its looks)
-- Units: µs from the server's TIME; ttl in µs; n = the funnel's concurrency.

local function server_now()
  local clock = redis.call('TIME')
  return clock[1] * 1000000 + clock[2]
end

local promoted = {}  -- {funnel index, task id} of each waiter handed a seat

-- leases that ran out (their worker died or lost Redis) free their seats; at most
-- 100 per call: bounded work
local function expire(holders, info, now)
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now, 'LIMIT', 0, 100)
  for _, id in ipairs(gone) do
    redis.call('ZREM', holders, id)
    redis.call('HDEL', info, id)
  end
end

-- the place in `waiters` of a waiter of priority `rank` arriving at `now` (µs): its
-- arrival in ms, after every waiter of its rank queued already (a burst within one ms
-- keeps the order the scripts ran in)
local function place(waiters, rank, now)
  local base = tonumber(rank) * 1e13
  local at = base + math.floor(now / 1000)
  local top = base + 1e13 - 1
  local last = redis.call('ZREVRANGEBYSCORE', waiters, top, base, 'WITHSCORES', 'LIMIT', 0, 1)
  if last[2] and tonumber(last[2]) >= at then
    at = tonumber(last[2]) + 1
  end
  return string.format('%.0f', at)
end

local skip_held = nil  -- a held waiter not handed a seat by this call (the caller)

-- hand a seat of funnel number `at` to held waiter `id` (its mark in `info`), kept for
-- it until its mark ends, and tell its worker; a waiter whose mark ended leaves the
-- queue. True when handed.
local function hand_held(holders, info, waiters, id, mark, now)
  local channel, ends = string.match(mark, '^(.*)|(%d+)$')
  local until_us = tonumber(ends or '0')
  if until_us <= now then
    redis.call('ZREM', waiters, id)
    redis.call('HDEL', info, 'held:' .. id)
    return false
  end
  redis.call('ZADD', holders, until_us, id)
  redis.call('HSET', info, id, '')
  redis.call('PUBLISH', channel, id)
  return true
end

-- free seats of funnel number `at` go to its first waiters, the most urgent then the
-- oldest: each gets its seat (held for ttl until it arrives; a held waiter's, until
-- its mark ends); a parked one is returned, to be published at once, a held one is
-- told on its worker's channel. Waiters holding a seat already number at most n:
-- 2n entries are read at a time, again after dropping dead held waiters (100 at most).
local function promote(at, holders, info, waiters, n, now, ttl)
  local free = n - redis.call('ZCARD', holders)
  local dropped = 0
  while free > 0 do
    local again = false
    for _, id in ipairs(redis.call('ZRANGE', waiters, 0, n + free - 1)) do
      if free <= 0 then
        break
      end
      if id ~= skip_held and not redis.call('ZSCORE', holders, id) then
        local mark = redis.call('HGET', info, 'held:' .. id)
        if not mark then
          redis.call('ZADD', holders, now + ttl, id)
          redis.call('HSET', info, id, '')
          promoted[#promoted + 1] = {at, id}
          free = free - 1
        elseif hand_held(holders, info, waiters, id, mark, now) then
          free = free - 1
        else
          dropped, again = dropped + 1, true
        end
      end
    end
    if not again or dropped >= 100 then
      break
    end
  end
end

-- whether the holder entry `held` belongs to `token` ("*": any; "": a handed seat)
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

-- "<funnel index>:<task id>" of each waiter handed a seat (but task `skip`) appended
-- to `reply`; returns it
local function extend_promoted(reply, skip)
  for _, pair in ipairs(promoted) do
    if pair[2] ~= skip then
      reply[#reply + 1] = pair[1] .. ':' .. pair[2]
    end
  end
  return reply
end
