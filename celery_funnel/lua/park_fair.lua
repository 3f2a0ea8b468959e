-- park_fair.lua: the parked tasks' side of fair-share funnels (see _fair.lua).
--
-- KEYS     the keys of _parked.lua, then last: the fair funnels with waiting tasks
--          (sorted set: funnel key -> when a task last joined its queue, µs)
-- ARGV[1]  "due": ARGV[2..] are pairs task id, slot (µs): each waiting entry is
--          made due at its slot. Reply: the ids that no longer wait parked (purged,
--          released, claimed), whose slot goes unused
--          "enlist": ARGV[2] a funnel key that has waiting tasks. Reply: 1
--          "delist": ARGV[2] a funnel key whose queue was seen empty, ARGV[3] µs:
--          forget it unless a task joined its queue within that long. Reply: 1 if
--          forgotten
-- A fair task waits parked with a far release time (a safety net, should its
-- queue entry be lost); the dispatcher moves it to its slot.

local registry = KEYS[#KEYS]
local op = ARGV[1]
if op == 'enlist' then
  redis.call('ZADD', registry, server_now(), ARGV[2])
  return 1
end
if op == 'delist' then
  local at = tonumber(redis.call('ZSCORE', registry, ARGV[2]))
  if at and at < server_now() - tonumber(ARGV[3]) then
    redis.call('ZREM', registry, ARGV[2])
    return 1
  end
  return 0
end
local gone = {}
for i = 2, #ARGV - 1, 2 do
  local id = ARGV[i]
  if redis.call('ZSCORE', due, id) and redis.call('HGET', claims, id) == '' then
    redis.call('ZADD', due, ARGV[i + 1], id)
  else
    gone[#gone + 1] = id
  end
end
return gone
