-- reserve.lua: book the next slot at which every one of N GCRA funnels admits a
-- request (all or nothing), optionally under a ticket. With one funnel, a ticket of
-- higher priority takes the earliest future slot booked by a less urgent ticket
-- (which, when it comes back, finds its ticket gone and books anew at the tail).
--
-- KEYS[1]    the tickets: sorted set, member = ticket id, score = its slot (us)
-- KEYS[2]    the tickets' priority ranks: hash, ticket id -> rank 1..255 (absent: 0)
-- KEYS[3..]  the funnels: strings, TAT in integer microseconds (shared with gcra.lua);
--            every key must share one Redis Cluster hash slot (a common {hash tag})
-- ARGV[1]  now in microseconds since the epoch, or "" to use the server's TIME
-- ARGV[2]  ticket id to book the slot under, or "" for none
-- ARGV[3]  "1" to redeem ARGV[2] first (the caller holds a booking), else "0"
-- ARGV[4]  early grace, us: a ticket is honoured from slot - early ...
-- ARGV[5]  late grace, us:  ... to slot + late; later, it is dropped (its booking
--          undone if it was the last one, with one funnel) and it books anew
-- ARGV[6]  max wait, us: book no slot further away than this (-1 = no bound;
--          0 = admit now or refuse, never book)
-- ARGV[7]  the ticket's priority rank, 0 (most urgent) .. 255, or "" for none (it
--          neither takes a slot nor gives one up)
-- ARGV[8], ARGV[9], ...  per funnel: increment (T * quantity, us), tau (T * limit, us)
-- ARGV[8 + 2n]  at most this many stale tickets are swept, and this many booked
--          tickets looked through for a less urgent one, per call
-- Reply    {status, delay (us), reset_after (us, the latest funnel), stale (1 = the
--          ticket came after its window)}; status 0 = admitted now, 1 = a slot is
--          booked (delay until it), 2 = not booked: delay > max wait, 3 = the request
--          can never fit in some funnel (delay -1)
-- A slot taken from another ticket was paid when that ticket booked it: no funnel's
-- TAT moves, so the rate stays exact; the displaced ticket pays for a new slot.

local now = now_us(ARGV[1])
if #KEYS == 3 and ARGV[3] ~= '1' then
  -- one funnel and nothing to redeem: when it admits now, this is gcra.lua's decision,
  -- and the gate's common case (a task that need not wait) costs no more than it
  local inc, tau = tonumber(ARGV[8]), tonumber(ARGV[9])
  local tat = tonumber(redis.call('GET', KEYS[3])) or now
  if tat < now then
    tat = now
  end
  if inc <= tau and tat + inc - tau <= now then
    tat = tat + inc
    redis.call('SET', KEYS[3], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
    return {0, 0, tat - now, 0}
  end
end
local ticket = ARGV[2]
local late = tonumber(ARGV[5])
local rank = tonumber(ARGV[7])
local n = #KEYS - 2
local bound = tonumber(ARGV[8 + 2 * n])

local tats, incs, taus = {}, {}, {}
local slot = now   -- the earliest time at which every funnel admits the request
local never = false
local latest = now
for i = 1, n do
  local tat = tonumber(redis.call('GET', KEYS[i + 2])) or now
  if tat < now then
    tat = now
  end
  tats[i], incs[i], taus[i] = tat, tonumber(ARGV[6 + 2 * i]), tonumber(ARGV[7 + 2 * i])
  if incs[i] > taus[i] then
    never = true
  end
  slot = math.max(slot, tat + incs[i] - taus[i])
  latest = math.max(latest, tat)
end

local stale = 0
if ARGV[3] == '1' then
  local booked = tonumber(redis.call('ZSCORE', KEYS[1], ticket))
  if booked then
    if now < booked - tonumber(ARGV[4]) then
      return {1, booked - now, latest - now, 0}
    end
    redis.call('ZREM', KEYS[1], ticket)
    redis.call('HDEL', KEYS[2], ticket)
    -- the slot was paid for when it was booked; honour it only near its time,
    -- so that tickets released together (say after an outage) cannot burst
    if now <= booked + late then
      return {0, 0, latest - now, 0}
    end
    stale = 1
    -- with one funnel, undo the booking if it was the last one (it left the TAT at
    -- booked + tau); a slot amid later bookings cannot be given back without
    -- bunching them, and with several funnels the last one cannot be known
    if n == 1 and tats[1] == booked + taus[1] then
      tats[1] = math.max(tats[1] - incs[1], now)
      slot = math.max(now, tats[1] + incs[1] - taus[1])
    end
  end
end

if never then
  return {3, -1, latest - now, stale}
end
local delay = slot - now
local max_wait = tonumber(ARGV[6])
if delay > 0 and ticket ~= '' and rank and rank < 255 and n == 1 and max_wait ~= 0
    and redis.call('EXISTS', KEYS[2]) == 1 then
  -- the earliest future slot of a less urgent ticket (tickets without a rank: 0)
  local future = string.format('(%.0f', now)
  local ahead = redis.call('ZRANGEBYSCORE', KEYS[1], future, '+inf', 'WITHSCORES', 'LIMIT', 0, bound)
  if #ahead > 0 then
    local ids = {}
    for j = 1, #ahead, 2 do
      ids[#ids + 1] = ahead[j]
    end
    local ranks = redis.call('HMGET', KEYS[2], unpack(ids))
    for j = 1, #ids do
      local at = tonumber(ahead[2 * j])
      if (tonumber(ranks[j]) or 0) > rank and (max_wait < 0 or at - now <= max_wait) then
        redis.call('ZREM', KEYS[1], ids[j])
        redis.call('HDEL', KEYS[2], ids[j])
        redis.call('ZADD', KEYS[1], string.format('%.0f', at), ticket)
        if rank > 0 then
          redis.call('HSET', KEYS[2], ticket, rank)
        end
        return {1, at - now, latest - now, stale}
      end
    end
  end
end
if delay > 0 and max_wait >= 0 and delay > max_wait then
  return {2, delay, latest - now, stale}
end
latest = now
for i = 1, n do
  -- the request arrives at `slot` in every funnel's virtual schedule
  local tat = math.max(tats[i], slot) + incs[i]
  redis.call('SET', KEYS[i + 2], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
  latest = math.max(latest, tat)
end
if delay <= 0 then
  return {0, 0, latest - now, stale}
end
if ticket ~= '' then
  -- slots only grow, so this booking outlives every ticket already in the set. Stale
  -- tickets (slot + late passed) are the lowest-ranked: drop at most `bound` of them
  -- per call (ZCOUNT is O(log N)), so one call's work stays bounded however many went
  -- stale; each booking adds one, so they cannot pile up.
  local stale_count = redis.call('ZCOUNT', KEYS[1], '-inf', string.format('(%.0f', now - late))
  if stale_count > 0 then
    local gone = redis.call('ZRANGE', KEYS[1], 0, math.min(stale_count, bound) - 1)
    redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #gone - 1)
    redis.call('HDEL', KEYS[2], unpack(gone))
  end
  if redis.call('ZCARD', KEYS[1]) == 0 then
    -- no ticket left (all redeemed, or dropped by hold.lua or rebase.lua): no rank is
    -- of use any more
    redis.call('DEL', KEYS[2])
  end
  redis.call('ZADD', KEYS[1], string.format('%.0f', slot), ticket)
  local ttl = math.ceil((delay + late) / 1000) + 1
  redis.call('PEXPIRE', KEYS[1], ttl)
  if rank and rank > 0 and n == 1 then
    redis.call('HSET', KEYS[2], ticket, rank)
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
return {1, delay, latest - now, stale}
