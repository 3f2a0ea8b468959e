-- fair_enqueue.lua: a task of a fair funnel joins its tenant's waiting queue.
--
-- KEYS     the ten of _fair.lua
-- ARGV[1]  task id
-- ARGV[2]  tenant
-- ARGV[3]  the tenant's weight (> 0)
-- ARGV[4]  priority rank, 0..255 (0 first)
-- ARGV[5]  cost (units)
-- ARGV[6]  "1": in front of its tenant's queue (it missed its slot), else "0"
-- ARGV[7]  T, µs per unit; ARGV[8] tau, µs (the funnel's shape, for the dispatcher)
-- Reply    1 when queued; 0 when it waits in the queue already (kept where it is)
-- A tenant that becomes active starts at the current virtual time: it cannot claim
-- credit for the time it had nothing waiting.

local id, tenant = ARGV[1], ARGV[2]
if redis.call('HEXISTS', ids, id) == 1 then
  return 0
end
local seq = 0
if ARGV[6] ~= '1' then
  seq = redis.call('HINCRBY', meta, 'seq', 1)
end
local member = tenant .. '\0' .. string.format('%02x%012x', tonumber(ARGV[4]), seq)
  .. '\0' .. ARGV[5] .. '\0' .. id
redis.call('ZADD', queue, 0, member)
redis.call('HSET', ids, id, member)
set_head(tenant)
redis.call('HSET', meta, 'T', ARGV[7], 'tau', ARGV[8])
if ARGV[3] ~= '1' then
  redis.call('HSET', meta, 'w:' .. tenant, ARGV[3])
end
if not redis.call('ZSCORE', tenants, tenant) then
  redis.call('ZADD', tenants, tonumber(redis.call('HGET', meta, 'vt')) or 0, tenant)
end
return 1
