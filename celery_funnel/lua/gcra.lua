-- gcra.lua: one CL.THROTTLE decision (GCRA, the funnel / leaky bucket).
--
-- KEYS[1]  the funnel: a string holding its TAT (theoretical arrival time),
--          integer microseconds since the epoch; it expires when the funnel is idle
-- ARGV[1]  increment = T * quantity, microseconds (T = emission interval; 0 peeks
--          and writes nothing)
-- ARGV[2]  tolerance tau = T * limit (limit = max_burst + 1), microseconds
-- ARGV[3]  now in microseconds since the epoch, or "" to use the server's TIME
-- Reply    one integer r: r >= 0 admitted, and TAT - now = r (us) after the call;
--          r < 0 refused, nothing written, and TAT - now = -r - 1 (us).
--          The caller derives remaining and retry_after from it (strategies/gcra.py).
-- Every value stays below 2^53, so Lua's doubles hold it exactly. The script does
-- no more than the maths needs: each call here costs the server time per decision.

local now = now_us(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new_tat = tat + ARGV[1]
if new_tat - ARGV[2] > now then
  return now - tat - 1
end
if ARGV[1] ~= '0' then
  -- a number argument reaches Redis as its exact integer text ('%.17g' / fpconv)
  redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000))
end
return new_tat - now
