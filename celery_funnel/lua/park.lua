-- park.lua: park a deferred task's message until its release time.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  task id
-- ARGV[2]  wait before release, integer microseconds (>= 0), from the server's TIME
-- ARGV[3]  the message (JSON text)
-- ARGV[4]  the release token the parked message carries ("" when it was never released)
-- ARGV[5]  the label of the funnel(s) that deferred it
-- Reply    {1, release time µs} when parked; {0, 0} when this message is a stale copy
--          (its task was released since: that release runs, the caller drops this)
-- A task parked again (the broker delivered its original message twice, or a released
-- copy was deferred again) keeps one entry: one release.

local id, carried = ARGV[1], ARGV[4]
local before = redis.call('HGET', accepted, id)
if before and before ~= carried and before ~= '+' .. carried then
  return {0, 0}
end
if before then  -- a copy of its latest release, deferred again: the next release runs
  redis.call('HSET', accepted, id, 'parked')
  redis.call('ZADD', accepted_at, server_now(), id)
end
forget(id)
local release = server_now() + tonumber(ARGV[2])
redis.call('ZADD', due, release, id)
redis.call('HSET', entries, id, ARGV[3])
redis.call('HSET', claims, id, '')
redis.call('HSET', labels, id, ARGV[5])
redis.call('HINCRBY', counts, ARGV[5], 1)
return {1, release}
