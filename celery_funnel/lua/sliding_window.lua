-- sliding_window.lua: N sub-window counters (seed 004); the window is the last N
-- sub-windows, the current one included.
--
-- KEYS[1]  the counters: one hash, sub-window i kept in field (i mod N) as the string
--          "<sub-window index>:<units>"; it expires when its newest sub-window leaves
--          the window (one key per funnel: no key names to build, ~10x less memory
--          than a key per counter)
-- ARGV[1]  limit, units per window (>= 1)
-- ARGV[2]  sub-window length, microseconds
-- ARGV[3]  quantity, units (>= 0; 0 peeks)
-- ARGV[4]  now in microseconds since the epoch, or "" to use the server's TIME
-- ARGV[5]  "1" to grant what fits when the whole quantity does not, else "0"
-- ARGV[6]  N, the number of sub-windows (1..100)
-- Reply    {granted (units), used (units in the window, after the call),
--           retry_after (us until the rest fits, -1 = none or never), reset_after (us)}

local limit = tonumber(ARGV[1])
local sub = tonumber(ARGV[2])
local quantity = tonumber(ARGV[3])
local now = now_us(ARGV[4])
local n = tonumber(ARGV[6])
local current = (now - math.fmod(now, sub)) / sub

-- live[k] = units of sub-window (current - n + k), k = 1..n (oldest first)
local live = {}
local used = 0
for k = 1, n do
  live[k] = 0
end
-- at most N fields: HGETALL reads them without naming them
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local value = fields[i + 1]
  local sep = string.find(value, ':', 1, true)
  local index = tonumber(string.sub(value, 1, sep - 1))
  local units = tonumber(string.sub(value, sep + 1))
  -- a field of another N (the limit's windows changed) is ignored, never counted twice
  if index > current - n and index <= current and tonumber(fields[i]) == math.fmod(index, n) then
    live[index - current + n] = units
    used = used + units
  end
end

local granted = quantity
if quantity > limit - used then
  granted = 0
  if ARGV[5] == '1' then
    granted = math.max(limit - used, 0)
  end
end
if granted > 0 then
  live[n] = live[n] + granted
  used = used + granted
  redis.call('HSET', KEYS[1], string.format('%.0f', math.fmod(current, n)),
    string.format('%.0f', current) .. ':' .. live[n])
  redis.call('PEXPIRE', KEYS[1], math.ceil(((current + n) * sub - now) / 1000))
end

-- sub-window k leaves the window when sub-window current + k starts
local retry_after = -1
local rest = quantity - granted
if rest > 0 and rest <= limit then
  local need = used + rest - limit
  local freed = 0
  for k = 1, n do
    freed = freed + live[k]
    if freed >= need then
      retry_after = (current + k) * sub - now
      break
    end
  end
end
local reset_after = 0
for k = n, 1, -1 do
  if live[k] > 0 then
    reset_after = (current + k) * sub - now
    break
  end
end
return {granted, used, retry_after, reset_after}
