-- park.lua: park a deferred task's message until its release time.
--
-- KEYS[1]  due: sorted set, task id -> release time (integer microseconds since the epoch)
-- KEYS[2]  entries: hash, task id -> the message to publish at release (JSON text)
-- KEYS[3]  claims: hash, task id -> token of the release that claimed it ("" = none)
-- KEYS[4]  leases: sorted set, task id -> end of a releaser's claim (microseconds)
-- KEYS[5]  accepted: hash, task id -> token of the released copy a worker accepted
-- ARGV[1]  task id
-- ARGV[2]  wait before release, integer microseconds (>= 0), from the server's TIME
-- ARGV[3]  the message (JSON text)
-- ARGV[4]  the release token the parked message carries ("" when it was never released)
-- Reply    {1, release time} when parked; {0, 0} when this message is a stale copy of a
--          task that was released and accepted already (the caller drops it)
-- A task parked again (the broker delivered its original message twice, or a released
-- copy was deferred again) keeps one entry: one release.

local id = ARGV[1]
local accepted = redis.call('HGET', KEYS[5], id)
if accepted and accepted ~= ARGV[4] then
  return {0, 0}
end
local clock = redis.call('TIME')
local release = clock[1] * 1000000 + clock[2] + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], release, id)
redis.call('HSET', KEYS[2], id, ARGV[3])
redis.call('HSET', KEYS[3], id, '')
redis.call('ZREM', KEYS[4], id)
return {1, release}
