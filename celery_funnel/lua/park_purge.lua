-- park_purge.lua: delete parked tasks (they never run), make them due now, or move
-- one's release time out.
--
-- KEYS       the eight of _parked.lua
-- ARGV[1]    "purge", "release" or "postpone"
-- ARGV[2..]  purge, release: task ids (the caller pages through them: bounded work
--            per call)
--            postpone: a task id, the release time park.lua gave it (µs), a wait (µs):
--            its release moves to that long from now if it still has that time (not
--            made due, booked, claimed or released since)
-- Reply      how many of them it purged, made due or postponed
-- A task being released at this moment (claimed) is left to its releaser.

local now = server_now()
if ARGV[1] == 'postpone' then
  local id = ARGV[2]
  if tonumber(redis.call('ZSCORE', due, id)) ~= tonumber(ARGV[3]) then
    return 0
  end
  redis.call('ZADD', due, now + tonumber(ARGV[4]), id)
  return 1
end
local count = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local at = redis.call('ZSCORE', due, id)
  if at then
    if ARGV[1] == 'purge' then
      forget(id)
      write_copies(id, 'gone', now)  -- a copy delivered later does not run either
      count = count + 1
    elseif tonumber(at) > now then
      redis.call('ZADD', due, now, id)
      count = count + 1
    end
  end
end
return count
