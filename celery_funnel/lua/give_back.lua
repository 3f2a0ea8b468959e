-- give_back.lua: a task that will not run (revoked while it waited) gives its booked
-- slot back to N GCRA funnels.
--
-- KEYS[1]    the tickets (sorted set, member = ticket id, score = slot in us)
-- KEYS[2..]  the funnels (TAT in integer microseconds, as reserve.lua keeps them)
-- ARGV[1]    now in microseconds since the epoch, or "" for the server's TIME
-- ARGV[2]    the ticket id
-- ARGV[3], ARGV[4], ...  per funnel: increment (T * quantity, us), tau (T * limit, us)
-- Reply      {booked (1 = the ticket was there, now gone), funnels given back}
--
-- A funnel takes the booking back only when it was its last one (the TAT is still
-- slot + tau, what booking at slot left): a slot amid later bookings cannot be given
-- back without bunching them, and stays spent.

local now = now_us(ARGV[1])
local slot = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[2]))
if not slot then
  return {0, 0}
end
redis.call('ZREM', KEYS[1], ARGV[2])
local given = 0
for i = 2, #KEYS do
  local inc, tau = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]))
  if tat and tat == slot + tau then
    local back = tat - inc
    if back > now then
      redis.call('SET', KEYS[i], string.format('%.0f', back), 'PX', math.ceil((back - now) / 1000))
    else
      redis.call('DEL', KEYS[i])
    end
    given = given + 1
  end
end
return {1, given}
