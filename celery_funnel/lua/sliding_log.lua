-- sliding_log.lua: a log of admitted units in a sorted set (seed 002), counted over the
-- last `period` microseconds. Exact, but memory grows with the limit.
--
-- KEYS[1]  the log: sorted set, one member per admitted unit, score = its time (us)
-- ARGV[1]  limit, units per period (>= 1)
-- ARGV[2]  period, microseconds
-- ARGV[3]  quantity, units (>= 0; 0 peeks)
-- ARGV[4]  now in microseconds since the epoch, or "" to use the server's TIME
-- Reply    {granted (units), used (units in the window, after the call),
--           retry_after (us, -1 = none or never), reset_after (us)}
-- Unlike the seed, refused requests are not logged: a client that keeps knocking
-- must not lock itself out.

local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local quantity = tonumber(ARGV[3])
local now = now_us(ARGV[4])
local key = KEYS[1]
local stamp = string.format('%.0f', now)

-- a unit logged at s counts while now - period < s
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - period))
local used = redis.call('ZCARD', key)

if quantity > 0 and used + quantity <= limit then
  -- members must be unique: number them after those already logged this microsecond
  local seq = redis.call('ZCOUNT', key, stamp, stamp)
  -- in batches: unpack() fails on a few thousand values
  local i = 1
  while i <= quantity do
    local args = {}
    for j = i, math.min(i + 499, quantity) do
      args[#args + 1] = stamp
      args[#args + 1] = stamp .. ':' .. (seq + j)
    end
    redis.call('ZADD', key, unpack(args))
    i = i + 500
  end
  redis.call('PEXPIRE', key, math.ceil(period / 1000))
  return {quantity, used + quantity, -1, period}
end

local granted, retry_after, reset_after = 0, -1, 0
if quantity > 0 and quantity <= limit then
  -- the unit whose expiry makes room for the whole quantity
  local oldest = redis.call('ZRANGE', key, used + quantity - limit - 1, used + quantity - limit - 1, 'WITHSCORES')
  retry_after = tonumber(oldest[2]) + period - now
end
if used > 0 then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  reset_after = tonumber(newest[2]) + period - now
end
return {granted, used, retry_after, reset_after}
