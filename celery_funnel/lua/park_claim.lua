-- park_claim.lua: a releaser claims the parked tasks that are due, with a lease.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  lead, microseconds: claim tasks due up to this long from now (the gate
--          holds an early arrival until its slot)
-- ARGV[2]  lease, microseconds: a claim not completed by then is claimed again
-- ARGV[3]  at most this many tasks
-- ARGV[4]  a token unique to this call (the released copies carry it)
-- ARGV[5]  keep acceptance records this long, microseconds
-- Reply    {next release time µs or -1, now µs, id1, message1, id2, message2, ...}
-- Work per call is bounded by ARGV[3] (claims) and 100 (expired records dropped).

local now = server_now()
local limit = tonumber(ARGV[3])
local reply = {-1, now}
local function claim(id)
  local message = redis.call('HGET', entries, id)
  local state = redis.call('HGET', accepted, id)
  if not message or (state and string.sub(state, 1, 1) == '+') then
    forget(id)  -- gone, or a copy of its release runs already (its releaser died after)
    if not state then
      redis.call('HDEL', accepted, origin_field(id))
    end
    return
  end
  claim_entry(id, ARGV[4], now, now + tonumber(ARGV[2]))
  reply[#reply + 1] = id
  reply[#reply + 1] = message
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
-- records of releases long done; a task still parked keeps its record
local old = redis.call('ZRANGEBYSCORE', accepted_at, '-inf', now - tonumber(ARGV[5]), 'LIMIT', 0, 100)
for _, id in ipairs(old) do
  if redis.call('HEXISTS', entries, id) == 1 then
    redis.call('ZADD', accepted_at, now, id)
  else
    redis.call('ZREM', accepted_at, id)
    redis.call('HDEL', accepted, id, origin_field(id))
  end
end
return reply
