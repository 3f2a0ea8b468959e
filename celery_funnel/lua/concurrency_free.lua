-- concurrency_free.lua: a run ended (or an operator frees its seat): give its seats back
-- and hand them to the first waiters. Idempotent: only the token's own entry goes.
--
-- KEYS       three per funnel (holders, info, waiters; see _concurrency.lua)
-- ARGV[1]    task id
-- ARGV[2]    the run's token; "" gives up a seat handed to a waiter and its place in
--            the queue (it will not come); "*" frees the task's seat whatever its token
-- ARGV[3]    lease ttl, µs (for the seats handed on)
-- ARGV[4..]  per funnel: its concurrency n
-- Reply      {seats given back, "<funnel index>:<task id>" of each waiter handed a seat...}

local now = server_now()
local id, token, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local released = 0
for i = 1, #KEYS / 3 do
  local holders, info, waiters = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  if owns(redis.call('HGET', info, id), token) then
    redis.call('ZREM', holders, id)
    redis.call('HDEL', info, id)
    released = released + 1
  end
  if token == '' or token == '*' then  -- it will not come: its place goes too
    redis.call('ZREM', waiters, id)
    redis.call('HDEL', info, 'held:' .. id)
  end
  expire(holders, info, now)
  promote(i, holders, info, waiters, tonumber(ARGV[3 + i]), now, ttl)
end
return extend_promoted({released}, nil)
