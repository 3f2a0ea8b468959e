-- park_done.lua: a releaser published the copy it claimed: forget the entry.
--
-- KEYS[1..4]  due, entries, claims, leases (as in park.lua)
-- ARGV[1]     task id
-- ARGV[2]     the token of the claim
-- Reply       1 when the entry was forgotten; 0 when it was parked or claimed again
--             since (the newer entry stays)

local due, entries, claims, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
if redis.call('HGET', claims, id) ~= ARGV[2] then
  return 0
end
redis.call('ZREM', due, id)
redis.call('ZREM', leases, id)
redis.call('HDEL', entries, id)
redis.call('HDEL', claims, id)
return 1
