-- _fair.lua: prepended (after _clock.lua) to every fair-share script (fair_*.lua) by
-- _fair_store.py.
-- KEYS (all nine, always in this order; one hash tag: the funnel's):
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
local funnel, tickets, tenants, queue, ids, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

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
