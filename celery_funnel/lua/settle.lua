-- settle.lua: runs charged an estimate on N GCRA funnels settle what they really
-- used: each funnel's TAT moves by (actual - charged) units at once, for every caller.
--
-- KEYS[1..N]     the funnels: strings, TAT in integer microseconds (shared with
--                gcra.lua); on a Redis Cluster they share one hash slot ({hash tag})
-- ARGV[1]        now in microseconds since the epoch, or "" to use the server's TIME
-- ARGV[2]        the most a TAT may run ahead of now, microseconds
-- ARGV[2 + i]    funnel i's change, microseconds (T * (actual - charged)): below 0
--                gives units back, above 0 charges them on top
-- Reply          per funnel, TAT - now after the call, microseconds (0: idle)
-- A funnel never gives back below idle (TAT = now, the key deleted): units charged
-- to a funnel that has since drained (or expired) are gone already. Extra units
-- charged on top may run the TAT past tau: a debt, paid before the next admission.

local now = now_us(ARGV[1])
local most = tonumber(ARGV[2])
local reply = {}
for i = 1, #KEYS do
  local change = tonumber(ARGV[2 + i])
  local tat = tonumber(redis.call('GET', KEYS[i]))
  if tat == nil or tat < now then
    tat = now
  end
  if change ~= 0 then
    tat = math.min(math.max(tat + change, now), now + most)
    if tat > now then
      redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
    else
      redis.call('DEL', KEYS[i])
    end
  end
  reply[i] = tat - now
end
return reply
