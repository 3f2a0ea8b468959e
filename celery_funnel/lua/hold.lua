-- hold.lua: an upstream refused us (HTTP 429 with Retry-After, say): admit nothing on
-- this GCRA funnel until now + hold, for every worker.
--
-- KEYS[1]  the funnel: string, TAT in integer microseconds (shared with gcra.lua)
-- KEYS[2]  the funnel's tickets (sorted set, same hash slot): deleted, so that every
--          booked caller books again after the hold
-- ARGV[1]  emission interval T, microseconds per unit
-- ARGV[2]  tolerance tau = T * limit, microseconds
-- ARGV[3]  hold, microseconds (>= 1)
-- ARGV[4]  now in microseconds since the epoch, or "" to use the server's TIME
-- Reply    the new TAT - now, microseconds
-- The next single unit fits exactly at now + hold: its TAT then is now + hold + tau.
-- Bookings are voided, so their increments beyond one full funnel are let go.

local t = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local now = now_us(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
tat = math.min(math.max(tat, now), now + tau)
local held = now + tonumber(ARGV[3]) + tau - t
if held > tat then
  tat = held
end
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
redis.call('DEL', KEYS[2])
return tat - now
