-- concurrency_queue.lua: a task refused a seat was parked: queue it behind the others of
-- its priority (ahead of the less urgent ones).
--
-- KEYS       three per funnel (holders, info, waiters; see _concurrency.lua)
-- ARGV[1]    task id
-- ARGV[2]    lease ttl, µs (a seat handed to a waiter is kept that long for it)
-- ARGV[3]    its priority rank, 0 (most urgent) .. 255 (the broker's order)
-- ARGV[4..]  per funnel: its concurrency n
-- Reply      {"<funnel index>:<task id>" of each waiter handed a seat by this call
--             (this task's own included, when a seat freed since it was refused)...}
-- A task queued again keeps its first place: the order survives re-parking.

local now = server_now()
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS / 3 do
  local holders, info, waiters = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local n = tonumber(ARGV[3 + i])
  expire(holders, info, now)
  local held = redis.call('HGET', info, ARGV[1])
  if held ~= '' then  -- not already handed a seat here
    redis.call('ZADD', waiters, 'NX', place(waiters, ARGV[3], now), ARGV[1])
  end
  promote(i, holders, info, waiters, n, now, ttl)
end
return extend_promoted({}, nil)
