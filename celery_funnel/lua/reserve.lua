-- reserve.lua: book the next free slot of a GCRA funnel, optionally under a ticket.
--
-- KEYS[1]  the funnel: string, TAT in integer microseconds (shared with gcra.lua)
-- KEYS[2]  the funnel's tickets: sorted set, member = ticket id, score = its slot (us);
--          must share KEYS[1]'s hash slot (a common {hash tag})
-- ARGV[1]  emission interval T, microseconds per unit
-- ARGV[2]  tolerance tau = T * limit, microseconds
-- ARGV[3]  quantity, units (>= 1)
-- ARGV[4]  now in microseconds since the epoch, or "" to use the server's TIME
-- ARGV[5]  ticket id to book the slot under, or "" for none
-- ARGV[6]  "1" to redeem ARGV[5] first (the caller holds a booking), else "0"
-- ARGV[7]  early grace, us: a ticket is honoured from slot - early ...
-- ARGV[8]  late grace, us:  ... to slot + late; later, it is dropped (its booking
--          undone if it was the last one) and it books anew
-- ARGV[9]  max wait, us: book no slot further away than this (-1 = no bound)
-- Reply    {status, delay (us), reset_after (us), stale (1 = the ticket came after
--          its window)}; status 0 = admitted now, 1 = a slot is booked (delay until
--          it), 2 = not booked: delay > max wait, 3 = the quantity can never fit
--          (delay -1)

local t = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local quantity = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not now then
  local clock = redis.call('TIME')
  now = clock[1] * 1000000 + clock[2]
end
local ticket = ARGV[5]
local late = tonumber(ARGV[8])

local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local stale = 0

if ARGV[6] == '1' then
  local slot = tonumber(redis.call('ZSCORE', KEYS[2], ticket))
  if slot then
    if now < slot - tonumber(ARGV[7]) then
      return {1, slot - now, tat - now, 0}
    end
    redis.call('ZREM', KEYS[2], ticket)
    -- the slot was paid for when it was booked; honour it only near its time,
    -- so that tickets released together (say after an outage) cannot burst
    if now <= slot + late then
      return {0, 0, tat - now, 0}
    end
    stale = 1
    -- stale: if it was the last booking (it left the TAT at slot + tau), undo it;
    -- a slot in the middle of others cannot be given back without bunching them
    if tat == slot + tau then
      tat = math.max(tat - t * quantity, now)
    end
  end
end

local increment = t * quantity
if increment > tau then
  return {3, -1, tat - now, stale}
end
local new_tat = tat + increment
local delay = new_tat - tau - now
local max_wait = tonumber(ARGV[9])
if delay > 0 and max_wait >= 0 and delay > max_wait then
  return {2, delay, tat - now, stale}
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
if delay <= 0 then
  return {0, 0, new_tat - now, stale}
end
if ticket ~= '' then
  -- slots only grow, so this booking outlives every ticket already in the set
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('(%.0f', now - late))
  redis.call('ZADD', KEYS[2], string.format('%.0f', new_tat - tau), ticket)
  redis.call('PEXPIRE', KEYS[2], math.ceil((delay + late) / 1000) + 1)
end
return {1, delay, new_tat - now, stale}
