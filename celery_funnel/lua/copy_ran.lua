-- copy_ran.lua: runs started from these copies, and their acks may not have reached the
-- broker (its connection died): the broker will deliver those messages again; they must
-- not run again.
--
-- KEYS       the eight of _parked.lua
-- ARGV       pairs: task id, the token of the copy that ran ("" for the message as first
--            sent)
-- Reply      how many it recorded (a task whose accepted copy is another one by now is
--            left alone)
-- A run whose worker dies mid-body is not recorded here: its message runs again, as
-- Celery's acks_late promises.

local now = server_now()
local recorded = 0
for i = 1, #ARGV - 1, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local kind, owner = read_copies(id)
  if kind == 'none' or (kind == 'copies' and owner == token) or (kind == 'ran' and owner == token) then
    write_copies(id, '+' .. token .. '!', now)
    recorded = recorded + 1
  end
end
return recorded
