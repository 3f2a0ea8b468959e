-- fair_forget.lua: tasks that no longer wait parked (purged, or released by hand)
-- leave their tenant's queue, so that no slot is handed to them.
--
-- KEYS       the ten of _fair.lua
-- ARGV[1..]  task ids
-- Reply      how many of them were waiting in this funnel's queues

local count = 0
for _, id in ipairs(ARGV) do
  local member = redis.call('HGET', ids, id)
  if member then
    redis.call('ZREM', queue, member)
    redis.call('HDEL', ids, id)
    count = count + 1
    local tenant = string.match(member, '^([^%z]*)%z')
    set_head(tenant)
    if not first_of(tenant) then
      redis.call('ZREM', tenants, tenant)
      redis.call('HDEL', meta, 'w:' .. tenant)
    end
  end
end
if count > 0 and redis.call('ZCARD', tenants) == 0 then
  redis.call('DEL', meta, heads)
end
return count
