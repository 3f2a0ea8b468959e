-- unique_free.lua: a unique task ended (or was never sent): free its key, if it holds it.
--
-- KEYS[1]  the unique key (string: the id of the task holding it)
-- ARGV[1]  the task id
-- Reply    1 when freed; 0 when another task (or none) holds it: left alone

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
