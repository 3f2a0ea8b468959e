-- concurrency_take.lua: take a seat in every concurrency funnel of a task, all or none;
-- refused, a task held in its worker (a channel given) is queued as a held waiter.
--
-- KEYS       three per funnel (holders, info, waiters; see _concurrency.lua)
-- ARGV[1]    task id
-- ARGV[2]    "<token>|<worker>" of this run (the token releases it)
-- ARGV[3]    lease ttl, µs
-- ARGV[4]    the pub/sub channel of the worker holding it ("": not held there, nothing
--            queued: a parked waiter is queued by concurrency_queue.lua)
-- ARGV[5]    how long its held waiter's mark lasts, µs (renewed at each of its looks)
-- ARGV[6]    its priority rank, 0 (most urgent) .. 255 (the broker's order)
-- ARGV[7..]  per funnel: its concurrency n
-- Reply      {1 when every seat is taken (0: none taken, the task must wait), now µs,
--             "<funnel index>:<task id>" of each parked waiter handed a seat by this
--             call...}
-- A seat handed to this task while it waited counts as its own; a seat held by
-- another run of the same task id (a duplicate delivery) does not. A held waiter
-- queued again keeps its first place: the order survives each look.

local now = server_now()
local id, ttl, channel = ARGV[1], tonumber(ARGV[3]), ARGV[4]
local funnels = #KEYS / 3
local taken = true
for i = 1, funnels do
  local holders, info, waiters = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local n = tonumber(ARGV[6 + i])
  expire(holders, info, now)
  promote(i, holders, info, waiters, n, now, ttl)  -- waiters first, then newcomers
  local held = redis.call('HGET', info, id)
  if held ~= '' and (held or redis.call('ZCARD', holders) >= n) then
    taken = false
  end
end
if taken then
  local value = ARGV[2] .. '|' .. string.format('%.0f', now)
  for i = 1, funnels do
    redis.call('ZADD', KEYS[3 * i - 2], now + ttl, id)
    redis.call('HSET', KEYS[3 * i - 1], id, value)
    redis.call('HDEL', KEYS[3 * i - 1], 'held:' .. id)
    redis.call('ZREM', KEYS[3 * i], id)
  end
else
  if channel ~= '' then
    skip_held = id  -- a seat it gives back below goes to the next waiter
  end
  -- a seat handed to it in one funnel is not kept while it waits for another
  for i = 1, funnels do
    local holders, info, waiters = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
    if redis.call('HGET', info, id) == '' then
      redis.call('ZREM', holders, id)
      redis.call('HDEL', info, id)
      promote(i, holders, info, waiters, tonumber(ARGV[6 + i]), now, ttl)
    end
    if channel ~= '' then
      local mark = channel .. '|' .. string.format('%.0f', now + tonumber(ARGV[5]))
      redis.call('ZADD', waiters, 'NX', place(waiters, ARGV[6], now), id)
      redis.call('HSET', info, 'held:' .. id, mark)
    end
  end
end
return extend_promoted({taken and 1 or 0, now}, id)
