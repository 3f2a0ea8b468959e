-- toy_gap.lua: the toy limiter kind of tests/integration/toy_kind.py (the recipe's
-- test, docs/architecture.md): a request of q units starts only when the funnel is
-- free, and keeps it busy for q gaps of period / count each.
--
-- KEYS[1]  the funnel: a hash {free = the time it is free from, us since the epoch};
--          expires then
-- ARGV[1]  count, units per period (>= 1): a larger quantity never fits
-- ARGV[2]  gap, microseconds one unit keeps the funnel busy (period / count, rounded up)
-- ARGV[3]  quantity, units (>= 0; 0 peeks)
-- ARGV[4]  now in microseconds since the epoch, or "" to use the server's TIME
-- Reply    {granted (units), busy (us until the funnel is free, after the call),
--           retry_after (us until the quantity fits, -1 = admitted, peeked or never)}

local count = tonumber(ARGV[1])
local gap = tonumber(ARGV[2])
local quantity = tonumber(ARGV[3])
local now = now_us(ARGV[4])

local free_at = tonumber(redis.call('HGET', KEYS[1], 'free') or '0')
local granted = 0
local retry_after = -1
if quantity > 0 and quantity <= count then
  if now >= free_at then
    granted = quantity
    free_at = now + quantity * gap
    redis.call('HSET', KEYS[1], 'free', string.format('%.0f', free_at))
    redis.call('PEXPIRE', KEYS[1], math.ceil(quantity * gap / 1000))
  else
    retry_after = free_at - now
  end
end
return {granted, math.max(free_at - now, 0), retry_after}
