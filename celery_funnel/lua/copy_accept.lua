-- copy_accept.lua: a worker received a copy of a task that the gate or a releaser made
-- (it carries a token), or a message the broker delivered again: may it go on?
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  task id
-- ARGV[2]  the copy's token ("" for the message as first sent)
-- ARGV[3]  "drop": the task was revoked; record it as settled, let nothing go on
-- ARGV[4]  the message's origin (same_message; "" when unknown)
-- ARGV[5]  keep settled records this long, microseconds
-- ARGV[6]  "1" when the broker delivered this message again
-- Reply    1: this copy goes on (it is the accepted one now); 0: drop it (another copy
--          was accepted, or the task is parked, purged or revoked); 2: another send
--          of the task id is on its way (this one waits: check it again later)
-- The first copy accepted wins: the others, delivered later, are dropped. Accepting a
-- released copy forgets the parked entry its release kept.

local id, token = ARGV[1], ARGV[2]
local now, kind, owner, pending = open_copies(id, token, tonumber(ARGV[5]), ARGV[4])
if now == 'busy' then
  return 2
end
if not now then
  return 0
end
if not may_go_on(kind, owner, pending, token, ARGV[6] == '1') then
  return 0
end
write_copies(id, ARGV[3] == 'drop' and 'gone' or copies_state(token, {}), now)
local claim = redis.call('HGET', claims, id)
if claim and claim ~= '' then  -- a release's copy: the release is done
  forget(id)
end
if ARGV[3] == 'drop' then
  return 0
end
return 1
