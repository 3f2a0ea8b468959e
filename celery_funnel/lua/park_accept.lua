-- park_accept.lua: a worker received a released copy of a parked task: run it or not.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  task id
-- ARGV[2]  the release token the copy carries
-- ARGV[3]  "drop": the task was revoked; record it as done, run nothing
-- Reply    1: run this copy (the first copy accepted, or the same copy delivered again
--          by the broker); 0: another copy of the release was accepted, drop it
-- Accepting also completes a release whose releaser died before it could say so.

local id, token = ARGV[1], ARGV[2]
local before = redis.call('HGET', accepted, id)
if before and before ~= token then
  return 0
end
redis.call('HSET', accepted, id, token)
redis.call('ZADD', accepted_at, server_now(), id)
local claim = redis.call('HGET', claims, id)
if claim and claim ~= '' then  -- claimed by a release, one of whose copies is here
  forget(id)
end
if ARGV[3] == 'drop' then
  return 0
end
return 1
