-- _fair.lua: prepended (after _clock.lua) to every fair-share script (fair_*.lua) by
-- _stores/fair.py.
-- KEYS (all ten, always in this order; one hash tag: the funnel's):
--   funnel   string      the GCRA funnel's TAT (µs), shared with gcra.lua/reserve.lua
--   tickets  sorted set  task id -> booked slot (µs), shared with reserve.lua
--   tenants  sorted set  tenant -> pass (virtual time) of the tenants with waiting tasks
--   queue    sorted set  every waiting task, all scores 0, ordered by member:
--                        "<tenant>\0<rank: 2 hex><seq: 12 hex>\0<cost>\0<task id>"
--   ids      hash        task id -> its member of queue
--   meta     hash        vt (virtual time), seq, T (µs per unit), tau (µs),
--                        "w:<tenant>" (weight, when not 1)
--   rate0..2 hashes      admissions per tenant in one second ("@" = which second),
--                        the second's number mod 3
--   heads    sorted set  tenant -> priority rank of its first waiting task
local funnel, tickets, tenants, queue, ids, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local heads = KEYS[10]

-- count one admission of `tenant` in the second holding `at` (µs)
local function count(tenant, at)
  local second = math.floor(at / 1000000)
  local key = KEYS[7 + second % 3]
  if redis.call('HGET', key, '@') ~= tostring(second) then
    redis.call('DEL', key)
    redis.call('HSET', key, '@', tostring(second))
  end
  redis.call('HINCRBY', key, tenant, 1)
  redis.call('PEXPIRE', key, 4000)
end

-- the first waiting member of `tenant` (its highest priority, then oldest), or nil
local function first_of(tenant)
  local found = redis.call('ZRANGEBYLEX', queue, '[' .. tenant .. '\0', '(' .. tenant .. '\1', 'LIMIT', 0, 1)
  return found[1]
end

-- `tenant`'s entry in heads: the rank of its first waiting task (none: no entry)
local function set_head(tenant)
  local first = first_of(tenant)
  if first then
    local rank = tonumber(string.match(first, '^[^%z]*%z(%x%x)'), 16)
    redis.call('ZADD', heads, rank, tenant)
  else
    redis.call('ZREM', heads, tenant)
  end
end

-- the tenant served next and its pass: the most urgent first task first (the broker's
-- priority), then the lowest pass (fair share); among the `scan` lowest passes, else
-- any tenant of that rank. nil when no tenant waits.
local function next_tenant(scan)
  local head = redis.call('ZRANGE', tenants, 0, scan - 1, 'WITHSCORES')
  if not head[1] then
    return nil
  end
  local top = redis.call('ZRANGE', heads, 0, 0, 'WITHSCORES')
  if not top[1] then
    return head[1], tonumber(head[2])
  end
  local urgent = tonumber(top[2])
  for j = 1, #head, 2 do
    if tonumber(redis.call('ZSCORE', heads, head[j])) == urgent then
      return head[j], tonumber(head[j + 1])
    end
  end
  local pass = tonumber(redis.call('ZSCORE', tenants, top[1]))
  if pass then
    return top[1], pass
  end
  redis.call('ZREM', heads, top[1])  -- not expected; keep the sets consistent
  return head[1], tonumber(head[2])
end
