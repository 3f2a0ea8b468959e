-- unique_renew.lua: a worker renews the unique keys of the tasks it runs, in one call.
--
-- KEYS     the unique keys (strings: the id of the task holding each)
-- ARGV[1]  how long each lasts from now, integer milliseconds
-- ARGV[2..] the task id that holds each key, in KEYS order
-- Reply    the 1-based indexes of the keys no longer held by their task (freed at its
--          end, or run out): the worker stops renewing them

local gone = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
  else
    gone[#gone + 1] = i
  end
end
return gone
