-- fixed_window.lua: a counter per window aligned on the epoch (INCRBY-style), with an
-- optional partial grant of what is left in the window (seed 004's acquire).
--
-- KEYS[1]  the counter: hash {w = window start (us), n = units granted in it};
--          expires when its window ends
-- ARGV[1]  limit, units per window (>= 1)
-- ARGV[2]  window length, microseconds
-- ARGV[3]  quantity, units (>= 0; 0 peeks)
-- ARGV[4]  now in microseconds since the epoch, or "" to use the server's TIME
-- ARGV[5]  "1" to grant what fits when the whole quantity does not, else "0"
-- Reply    {granted (units), used (units in this window, after the call),
--           retry_after (us until the rest fits, -1 = none or never), reset_after (us)}

local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local quantity = tonumber(ARGV[3])
local now = now_us(ARGV[4])

-- math.fmod is exact on integral doubles; Lua's % operator divides and may round
local start = now - math.fmod(now, window)
local finish = start + window
local state = redis.call('HMGET', KEYS[1], 'w', 'n')
local used = 0
if tonumber(state[1]) == start then
  used = tonumber(state[2])
end

local free = math.max(limit - used, 0)
local granted = quantity
if quantity > free then
  granted = 0
  if ARGV[5] == '1' then
    granted = free
  end
end
if granted > 0 then
  used = used + granted
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', start), 'n', used)
  redis.call('PEXPIRE', KEYS[1], math.ceil((finish - now) / 1000))
end

local retry_after = -1
local rest = quantity - granted
if rest > 0 and rest <= limit then
  retry_after = finish - now
end
local reset_after = 0
if used > 0 then
  reset_after = finish - now
end
return {granted, used, retry_after, reset_after}
