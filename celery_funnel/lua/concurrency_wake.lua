-- concurrency_wake.lua: parked tasks handed a concurrency seat: claim them for release now
-- (the caller publishes them at once; the entry goes when a worker accepts the copy).
--
-- KEYS       the eight of _parked.lua
-- ARGV[1]    lease of the claim, µs (a publisher that dies is replaced by a releaser
--            once it runs out, as for due tasks)
-- ARGV[2]    a token unique to this call (the released copies carry it)
-- ARGV[3..]  task ids
-- Reply      {m, ids of the m tasks no longer parked (purged, or released and run: the
--             caller gives their seats up), id1, message1, id2, message2, ...}
-- A task being released already (claimed) is left to its releaser.

local now = server_now()
local missing, claimed = {}, {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local message = redis.call('HGET', entries, id)
  if not message then
    missing[#missing + 1] = id
  elseif redis.call('HGET', claims, id) == '' then
    if claim_entry(id, ARGV[2], now, tonumber(ARGV[1])) then
      claimed[#claimed + 1] = id
      claimed[#claimed + 1] = message
    else
      missing[#missing + 1] = id  -- a copy of it was accepted: it runs already
    end
  end
end
local reply = {#missing, unpack(missing)}
for _, item in ipairs(claimed) do
  reply[#reply + 1] = item
end
return reply
