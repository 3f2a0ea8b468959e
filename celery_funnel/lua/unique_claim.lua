-- unique_claim.lua: a unique task (funnel_unique) takes its key, unless another task
-- holds it.
--
-- KEYS[1]  the unique key: string, the id of the task that holds it
-- ARGV[1]  the task id that claims it
-- ARGV[2]  how long the claim lasts unless renewed, integer milliseconds
-- ARGV[3]  the id of a task whose run ended (its outcome is stored) that may still hold
--          the key, its end not yet seen: taken over from it ("" for none)
-- Reply    {1, task id}: held by this task now (taken, taken over, or held by it
--          already: a retry or a gate's re-publish of the same task, whose claim is
--          extended); {0, holder}: held by another task, nothing changed

local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] and holder ~= ARGV[3] then
  return {0, holder}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, ARGV[1]}
