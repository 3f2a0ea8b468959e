-- sliding_window.lua: N sub-window counters (seed 004); the window is the last N
-- sub-windows, the current one included.
--
-- KEYS[1..N]  a ring of counters, sub-window i kept in KEYS[(i mod N) + 1] as the
--             string "<sub-window index>:<units>"; the keys share one {hash tag}
--             so that Redis Cluster keeps them in one slot
-- ARGV[1]  limit, units per window (>= 1)
-- ARGV[2]  sub-window length, microseconds
-- ARGV[3]  quantity, units (>= 0; 0 peeks)
-- ARGV[4]  now in microseconds since the epoch, or "" to use the server's TIME
-- ARGV[5]  "1" to grant what fits when the whole quantity does not, else "0"
-- Reply    {granted (units), used (units in the window, after the call),
--           retry_after (us until the rest fits, -1 = none or never), reset_after (us)}

local limit = tonumber(ARGV[1])
local sub = tonumber(ARGV[2])
local quantity = tonumber(ARGV[3])
local now = now_us(ARGV[4])
local n = #KEYS
local current = (now - math.fmod(now, sub)) / sub

-- live[k] = units of sub-window (current - n + k), k = 1..n (oldest first)
local live = {}
local used = 0
local values = redis.call('MGET', unpack(KEYS))
for k = 1, n do
  live[k] = 0
end
for i = 1, n do
  local value = values[i]
  if value then
    local sep = string.find(value, ':', 1, true)
    local index = tonumber(string.sub(value, 1, sep - 1))
    local units = tonumber(string.sub(value, sep + 1))
    if index > current - n and index <= current then
      live[index - current + n] = units
      used = used + units
    end
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
  redis.call('SET', KEYS[math.fmod(current, n) + 1],
    string.format('%.0f', current) .. ':' .. live[n],
    'PX', math.ceil(((current + n) * sub - now) / 1000))
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
