-- gcra.lua: one CL.THROTTLE decision (GCRA, the funnel / leaky bucket).
--
-- KEYS[1]  the funnel: a string holding its TAT (theoretical arrival time),
--          integer microseconds since the epoch. Expires when the funnel is idle.
-- ARGV[1]  emission interval T, integer microseconds per unit (>= 1)
-- ARGV[2]  tolerance tau = T * limit (limit = max_burst + 1), microseconds
-- ARGV[3]  quantity, units (>= 0; 0 peeks and writes nothing)
-- ARGV[4]  now in microseconds since the epoch, or "" to use the server's TIME
-- Reply    {limited (0|1), remaining (units), retry_after (us, -1 = none),
--           reset_after (us)}
-- Numbers stay below 2^53, so Lua's doubles hold every value exactly.

local t = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local quantity = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not now then
  local clock = redis.call('TIME')
  now = clock[1] * 1000000 + clock[2]
end

local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local increment = t * quantity
local new_tat = tat + increment

local limited, retry_after, ttl = 0, -1, new_tat - now
if new_tat - tau > now then
  limited = 1
  ttl = tat - now
  -- a quantity larger than the whole funnel can never fit: no retry time
  if increment <= tau then
    retry_after = new_tat - tau - now
  end
elseif quantity > 0 then
  -- %.0f: tostring() would print 16-digit numbers in exponent form
  redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil(ttl / 1000))
end

local remaining = 0
if tau > ttl then
  remaining = math.floor((tau - ttl) / t)
end
return {limited, remaining, retry_after, ttl}
