-- park.lua: park a deferred task's message until its release time.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  task id
-- ARGV[2]  wait before release, integer microseconds (>= 0), from the server's TIME
-- ARGV[3]  the message (JSON text)
-- ARGV[4]  the release token the parked message carries ("" when it was never released)
-- ARGV[5]  the label of the funnel(s) that deferred it
-- Reply    {1, release time µs} when parked; {0, 0} when this message is a stale copy
--          of a task that was released and accepted already (the caller drops it)
-- A task parked again (the broker delivered its original message twice, or a released
-- copy was deferred again) keeps one entry: one release.

local id = ARGV[1]
local before = redis.call('HGET', accepted, id)
if before and before ~= ARGV[4] then
  return {0, 0}
end
forget(id)
local release = server_now() + tonumber(ARGV[2])
redis.call('ZADD', due, release, id)
redis.call('HSET', entries, id, ARGV[3])
redis.call('HSET', claims, id, '')
redis.call('HSET', labels, id, ARGV[5])
redis.call('HINCRBY', counts, ARGV[5], 1)
return {1, release}
