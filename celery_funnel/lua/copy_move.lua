-- copy_move.lua: the gate is about to publish a new copy of a task it holds (a wait
-- longer than the broker lets it keep the message): record the copy first.
--
-- KEYS     the eight of _parked.lua
-- ARGV[1]  task id
-- ARGV[2]  the token of the copy held ("" for the message as first sent)
-- ARGV[3]  the token of the new copy
-- ARGV[4]  the message's origin (same_message; "" when unknown)
-- ARGV[5]  keep settled records this long, microseconds
-- Reply    1: recorded; publish the new copy, then ack the one held. 0: the copy held
--          is not the task's accepted one (a stale copy): drop it, publish nothing.
--          2: another send of the task id is on its way: publish nothing, keep the
--          one held (it waits, and tries again)
-- Until a copy is accepted, the held one stays the owner: delivered again (its worker
-- died before acking it), it goes on and the new copy is dropped when it comes; the
-- new copy arriving first is accepted and the held one is dropped when it comes.

local id, from = ARGV[1], ARGV[2]
local now, kind, owner, pending = open_copies(id, from, tonumber(ARGV[5]), ARGV[4])
if now == 'busy' then
  return 2
end
if not now then
  return 0
end
if kind == 'none' or (kind == 'ran' and owner == from) then  -- (a retry of a run: new)
  owner, pending = from, {}
elseif kind ~= 'copies' or owner ~= from then
  return 0
end
pending[#pending + 1] = ARGV[3]
write_copies(id, copies_state(owner, pending), now)
return 1
