-- park_purge.lua: delete parked tasks (they never run), or make them due now.
--
-- KEYS       the eight of _parked.lua
-- ARGV[1]    "purge" or "release"
-- ARGV[2..]  task ids (the caller pages through them: bounded work per call)
-- Reply      how many of them it purged or made due
-- A task being released at this moment (claimed) is left to its releaser.

local count = 0
local now = server_now()
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
