-- park.lua: park a deferred task's message until its release time.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  task id
-- ARGV[2]  wait before release, integer microseconds (>= 0), from the server's TIME
-- ARGV[3]  the message (JSON text)
-- ARGV[4]  the release token the parked message carries ("" when it was never released)
-- ARGV[5]  the label of the funnel(s) that deferred it
-- ARGV[6]  the message's origin: the same for every copy of one message, another for
--          a later message given the same task id ("" when unknown)
-- Reply    {1, release time µs} when parked; {0, 0} when this message is a stale copy
--          (its task was released since: that release runs, the caller drops this)
-- A task parked again (the broker delivered its original message twice, or a released
-- copy was deferred again) keeps one entry: one release. A message without a token of
-- an origin new to its id is a task of its own (Celery's `replace` gives the last task
-- of a chain, or the body of a chord, the replaced task's id; another run sends it):
-- the id's record starts afresh, and copies of the earlier messages stay stale.

local id, carried, origin = ARGV[1], ARGV[4], ARGV[6]
local before = redis.call('HGET', accepted, id)
if carried == '' and origin ~= '' then
  -- the origins parked under this id, oldest first, each after a NUL
  local field = origin_field(id)
  local seen = '\0' .. (redis.call('HGET', accepted, field) or '')
  local this = '\0' .. origin
  if seen == '\0' then
    redis.call('HSET', accepted, field, origin)
  elseif string.sub(seen, -#this) == this then
    -- the latest message under this id: the token decides, below
  elseif string.find(seen .. '\0', this .. '\0', 1, true) then
    return {0, 0}  -- a copy of an earlier message under this id
  else
    redis.call('HSET', accepted, field, string.sub(seen, 2) .. this)
    if before then
      redis.call('HDEL', accepted, id)
      redis.call('ZREM', accepted_at, id)
      before = false
    end
  end
end
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
