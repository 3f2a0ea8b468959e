-- rebase.lua: a GCRA funnel's state once its limit changed (an override set or ended),
-- so that the new limit applies to the next decision.
--
-- KEYS[1]  the funnel: a string holding its TAT, integer microseconds since the epoch
-- KEYS[2]  its reservation tickets (sorted set, score = slot in us); same hash tag
-- KEYS[3]  their priority ranks (hash); same hash tag
-- ARGV[1]  tau of the new limit (T * limit), microseconds
-- ARGV[2]  now in microseconds since the epoch, or "" to use the server's TIME
-- Reply    {tickets dropped, 1 if the TAT was lowered else 0}
-- Slots booked under the old rate would keep its pace (a raised rate would wait behind
-- them): the tickets are dropped and their tasks, when they come back, decide anew.
-- A TAT past now + tau (the backlog of those bookings) is lowered to now + tau: the
-- funnel counts as full at the change, so no burst passes; a lower TAT is kept.

local now = now_us(ARGV[2])
local tau = tonumber(ARGV[1])
local dropped = redis.call('ZCARD', KEYS[2])
redis.call('DEL', KEYS[2], KEYS[3])
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat and tat > now + tau then
  redis.call('SET', KEYS[1], now + tau, 'PX', math.ceil(tau / 1000))
  return {dropped, 1}
end
return {dropped, 0}
