-- park_accept.lua: a worker received a released copy of a parked task: run it or not.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  task id
-- ARGV[2]  the release token the copy carries
-- ARGV[3]  "drop": the task was revoked; record it as done, run nothing
-- Reply    1: run this copy (a copy of the task's latest release, accepted now, or the
--          copy accepted before, delivered again by the broker); 0: drop it (a copy of
--          an older release, or another copy was accepted)
-- Accepting also completes a release whose releaser died before it could say so.

local id, token = ARGV[1], ARGV[2]
local state = redis.call('HGET', accepted, id)
if state == '+' .. token then
  return 1  -- the copy accepted before, delivered again by the broker
end
if state and state ~= token then
  return 0  -- a copy of an older release, or of one that is not the latest
end
redis.call('HSET', accepted, id, '+' .. token)
redis.call('ZADD', accepted_at, server_now(), id)
local claim = redis.call('HGET', claims, id)
if claim == token then  -- its releaser may have died before it could say so
  forget(id)
end
if ARGV[3] == 'drop' then
  return 0
end
return 1
