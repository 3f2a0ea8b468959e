-- _clock.lua: prepended to every script by _limiter/scripts.py (Redis scripts cannot import).
-- now_us(arg): arg as integer microseconds since the epoch, or, when arg is "", the
-- Redis server's TIME: the one clock every worker shares.
local function now_us(arg)
  local now = tonumber(arg)
  if now then
    return now
  end
  local clock = redis.call('TIME')
  return clock[1] * 1000000 + clock[2]
end

