-- park_claim.lua: a releaser claims the parked tasks that are due, with a lease.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  lead, microseconds: claim tasks due up to this long from now (the gate
--          holds an early arrival until its slot)
-- ARGV[2]  lease, microseconds: a claim whose copy no worker accepted by then is
--          claimed again (each time for twice as long, claim_entry)
-- ARGV[3]  at most this many tasks
-- ARGV[4]  a token unique to this call (the released copies carry it)
-- ARGV[5]  keep settled records of copies this long, microseconds
-- Reply    {next release time µs or -1, now µs, id1, message1, id2, message2, ...}
-- Work per call is bounded by ARGV[3] (claims) and 100 (expired records dropped).

local now = server_now()
local limit = tonumber(ARGV[3])
local reply = {-1, now}
local function claim(id)
  local message = redis.call('HGET', entries, id)
  if not message then
    forget(id)  -- purged meanwhile
    return
  end
  if claim_entry(id, ARGV[4], now, tonumber(ARGV[2])) then
    reply[#reply + 1] = id
    reply[#reply + 1] = message
  end
end
-- a releaser that died mid-release: its leases ran out, claim those again first
for _, id in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit)) do
  claim(id)
end
local room = limit - (#reply - 2) / 2
if room > 0 then
  local horizon = now + tonumber(ARGV[1])
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', horizon, 'LIMIT', 0, room)) do
    claim(id)
  end
end
local first = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
if first[2] then
  reply[1] = tonumber(first[2])
end
expire_copies(now, tonumber(ARGV[5]), 100)
return reply
