-- fair_pop.lua: the dispatcher hands the funnel's next free slots to waiting tasks,
-- one tenant at a time by weighted round-robin (stride scheduling), and books each
-- slot in the GCRA funnel under the task's id (its ticket: fair_admit.lua admits it).
--
-- KEYS     the ten of _fair.lua
-- ARGV[1]  now in microseconds since the epoch, or "" to use the server's TIME
-- ARGV[2]  horizon, µs: book slots up to this far ahead only (a tenant arriving
--          later waits behind at most this much)
-- ARGV[3]  at most this many tasks per call
-- ARGV[4]  late grace, µs (how long a ticket lives past its slot)
-- Reply    {tenants still waiting, now µs, id1, slot1 µs, id2, slot2, ...}
-- Each pick: the tenant whose first task is the most urgent (the broker's priority),
-- among those the one with the lowest pass (ties: by name), and its first task (the
-- most urgent, then the oldest); the tenant's pass then grows by cost / weight.
-- O(log n) per task in the number of waiting tasks and tenants when the lowest pass
-- holds the most urgent task; else up to SCAN tenants are looked at. A tenant whose queue empties is
-- forgotten (its pass and weight); the funnel's state goes when no tenant waits.

local now = now_us(ARGV[1])
local horizon, limit, late = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t, tau = tonumber(redis.call('HGET', meta, 'T')), tonumber(redis.call('HGET', meta, 'tau'))
local reply = {0, now}
if not t then
  reply[1] = redis.call('ZCARD', tenants)
  return reply
end
local tat = tonumber(redis.call('GET', funnel)) or now
if tat < now then
  tat = now
end
local SCAN = 100
local booked = 0
while booked < limit do
  local tenant, pass = next_tenant(SCAN)
  if not tenant then
    break
  end
  local member = first_of(tenant)
  if not member then  -- not expected; keep the set consistent
    redis.call('ZREM', tenants, tenant)
    redis.call('ZREM', heads, tenant)
  else
    local _, _, cost, id = string.find(member, '^[^%z]*%z[^%z]*%z([^%z]*)%z(.*)$')
    local inc = t * tonumber(cost)
    local slot = math.max(tat + inc - tau, now)
    if slot > now + horizon then
      break
    end
    tat = math.max(tat, slot) + inc
    redis.call('ZREM', queue, member)
    redis.call('HDEL', ids, id)
    redis.call('ZADD', tickets, string.format('%.0f', slot), id)
    redis.call('HSET', meta, 'vt', pass)
    set_head(tenant)
    if first_of(tenant) then
      local weight = tonumber(redis.call('HGET', meta, 'w:' .. tenant)) or 1
      redis.call('ZADD', tenants, pass + tonumber(cost) / weight, tenant)
    else
      redis.call('ZREM', tenants, tenant)
      redis.call('HDEL', meta, 'w:' .. tenant)
    end
    count(tenant, slot)
    booked = booked + 1
    reply[#reply + 1] = id
    reply[#reply + 1] = slot
  end
end
if booked > 0 then
  redis.call('SET', funnel, string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
  redis.call('PEXPIRE', tickets, math.ceil((tat - now + late) / 1000) + 1000)
  -- tickets of tasks that never came back for their slot: long past any use
  redis.call('ZREMRANGEBYSCORE', tickets, '-inf', now - late - 10000000)
end
reply[1] = redis.call('ZCARD', tenants)
if reply[1] == 0 then
  redis.call('DEL', meta, heads)  -- nothing waits: the virtual time starts again from 0
end
return reply
