-- concurrency_renew.lua: one worker renews every lease it holds, in one call, and sweeps the
-- funnels it knows for leases that ran out (their worker died): their seats go to the
-- first waiters (the most urgent, then the oldest).
--
-- KEYS       three per funnel (holders, info, waiters; see _concurrency.lua)
-- ARGV[1]    lease ttl, µs
-- ARGV[2..]  per funnel: n, then m (leases of this worker in it), then m pairs
--            (task id, token)
-- Reply      {g, "<funnel index>:<task id>" of g leases no longer held (released by
--             the task's own process, or by an operator), e, indexes (1-based) of the
--             e funnels that hold nothing and queue nothing, "<funnel index>:<task
--             id>" of each waiter handed a seat...}

local now = server_now()
local ttl = tonumber(ARGV[1])
local gone, empty = {}, {}
local at = 2
for i = 1, #KEYS / 3 do
  local holders, info, waiters = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local n, m = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  at = at + 2
  for j = 0, m - 1 do
    local id, token = ARGV[at + 2 * j], ARGV[at + 2 * j + 1]
    if owns(redis.call('HGET', info, id), token) then
      redis.call('ZADD', holders, 'XX', now + ttl, id)
    else
      gone[#gone + 1] = i .. ':' .. id
    end
  end
  at = at + 2 * m
  expire(holders, info, now)
  promote(i, holders, info, waiters, n, now, ttl)
  if redis.call('ZCARD', holders) == 0 and redis.call('ZCARD', waiters) == 0 then
    empty[#empty + 1] = i
  end
end
local reply = extend({#gone}, gone)
reply[#reply + 1] = #empty
return extend_promoted(extend(reply, empty), nil)
