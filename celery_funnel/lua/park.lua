-- park.lua: park a deferred task's message until its release time.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  task id
-- ARGV[2]  wait before release, integer microseconds (>= 0), from the server's TIME
-- ARGV[3]  the message (JSON text)
-- ARGV[4]  the token of the copy being parked ("" for the message as first sent)
-- ARGV[5]  the label of the funnel(s) that deferred it
-- ARGV[6]  the message's origin (same_message; "" when unknown)
-- ARGV[7]  (a backup) the token of a copy of the task the caller publishes at once, or
--          "" (absent: ""): the entry is claimed for that copy at once, for ARGV[8] µs
-- ARGV[8]  (a backup) how long the claim lasts, µs: the copy's countdown and a grace
-- Reply    {1, release time µs} when parked; {0, 0} when this message is a stale copy
--          (another copy was accepted, or the task is parked already: the caller
--          drops this one); {2, 0} when another send of the task id is on its way
--          (parked, or a copy of it published): nothing parked, the caller keeps it
-- A backup is the entry of a copy published again with a countdown (a wait the worker
-- may not hold, where nothing is parked): not counted as parked (no label), forgotten
-- when a worker accepts the copy, and published again by a releaser should none have
-- by the end of its claim (the copy was lost on its way: kombu's Redis transport takes
-- a message off the queue before it records it as delivered).
-- Parking is a move of the task to the parked entry, in one call: from then on the
-- entry holds it, and every copy delivered (the original, should its ack be lost) is
-- dropped; its release publishes the one copy that goes on.

local id, carried = ARGV[1], ARGV[4]
local same = same_message(id, carried, ARGV[6])
if same == 'busy' then
  return {2, 0}
end
if not same then
  return {0, 0}
end
local kind, owner, pending = read_copies(id)
-- (a copy delivered again was checked on arrival: one that comes here is new)
if not may_go_on(kind, owner, pending, carried, false) then
  return {0, 0}
end
local now = server_now()
write_copies(id, 'parked', now)
forget(id)
local release = now + tonumber(ARGV[2])
redis.call('ZADD', due, release, id)
redis.call('HSET', entries, id, ARGV[3])
redis.call('HSET', claims, id, '')
local copy = ARGV[7] or ''
if copy ~= '' then
  claim_entry(id, copy, now, tonumber(ARGV[8]))
  return {1, release}
end
redis.call('HSET', labels, id, ARGV[5])
redis.call('HINCRBY', counts, ARGV[5], 1)
return {1, release}
