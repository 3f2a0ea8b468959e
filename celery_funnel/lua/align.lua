-- align.lua: an upstream told us what remains of its limits: raise N GCRA funnels'
-- TATs so that none admits more than that (never lowered: a funnel stricter than the
-- upstream stays so).
--
-- KEYS[1..N]     the funnels: strings, TAT in integer microseconds (shared with
--                gcra.lua); on a Redis Cluster they share one hash slot ({hash tag})
-- ARGV[1]        now in microseconds since the epoch, or "" to use the server's TIME
-- ARGV[1 + i]    funnel i's floor, microseconds: its TAT becomes at least now + floor
--                (the caller works it out from tau, T and the upstream's quota)
-- Reply          per funnel, TAT - now after the call, microseconds (0: idle)

local now = now_us(ARGV[1])
local reply = {}
for i = 1, #KEYS do
  local floor = now + tonumber(ARGV[1 + i])
  local tat = tonumber(redis.call('GET', KEYS[i]))
  if tat == nil or tat < now then
    tat = now
  end
  if floor > tat then
    tat = floor
    redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
  end
  reply[i] = tat - now
end
return reply
