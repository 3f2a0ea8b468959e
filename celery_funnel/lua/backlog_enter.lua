-- backlog_enter.lua: count a task as sent and not yet started (funnel_max_waiting),
-- unless the funnel's backlog is full.
--
-- KEYS[1]  the backlog: sorted set, member = task id, score = when it stops counting
--          (us since the epoch): a task whose start was never seen (its producer died
--          before publishing, its message was purged) drops out then
-- ARGV[1]  now in microseconds since the epoch, or "" for the server's TIME
-- ARGV[2]  the task id
-- ARGV[3]  the most tasks that may wait (N)
-- ARGV[4]  how long an entry counts (us)
-- ARGV[5]  "1": count it whatever the backlog holds (a task accepted before: a retry)
-- Reply    {entered (1 = counted, or counted already; 0 = full: not counted), waiting
--          (tasks counted after this call)}

local now = now_us(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
local until_us = now + tonumber(ARGV[4])
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  -- the same task sent again (a retry, a re-publish by hand): counted once
  redis.call('ZADD', KEYS[1], string.format('%.0f', until_us), ARGV[2])
  return {1, redis.call('ZCARD', KEYS[1])}
end
local waiting = redis.call('ZCARD', KEYS[1])
if waiting >= tonumber(ARGV[3]) and ARGV[5] ~= '1' then
  return {0, waiting}
end
redis.call('ZADD', KEYS[1], string.format('%.0f', until_us), ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[4]) / 1000))
return {1, waiting + 1}
