-- park_done.lua: a releaser published the copy it claimed: forget the entry.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  task id
-- ARGV[2]  the token of the claim
-- Reply    1 when the entry was forgotten; 0 when it was parked or claimed again since
--          (the newer entry stays)

if redis.call('HGET', claims, ARGV[1]) ~= ARGV[2] then
  return 0
end
forget(ARGV[1])
return 1
