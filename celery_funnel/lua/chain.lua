-- chain.lua: several decisions in one atomic call, in order, stopping at the first that
-- refuses: what running their scripts one at a time does, in one round trip.
-- backends/_chain.py puts the decisions before this text: DECISIONS[i].run(KEYS, ARGV)
-- is decision script i's own text as a function, DECISIONS[i].admitted(r, ARGV) its
-- test of admission (Script.admitted).
--
-- KEYS     every decision's keys, one decision after the other (all in one Redis
--          Cluster hash slot)
-- ARGV[1]  n, the number of decisions
-- ARGV[2i], ARGV[2i + 1]  decision i's number of keys and of arguments (i = 1..n)
-- ARGV[2n + 2 ...]  every decision's arguments, one decision after the other
-- Reply    one reply per decision run, each a table (a number reply x becomes {x}):
--          every decision's when all admit, else the decisions' up to the first that
--          refuses
-- Units    each decision's own (see its script's header)

local n = tonumber(ARGV[1])
local replies = {}
local k, a = 0, 2 * n + 1
for i = 1, n do
  local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local keys, argv = {}, {}
  for j = 1, nk do
    keys[j] = KEYS[k + j]
  end
  for j = 1, na do
    argv[j] = ARGV[a + j]
  end
  k, a = k + nk, a + na
  local r = DECISIONS[i].run(keys, argv)
  if type(r) ~= 'table' then
    r = {r}
  end
  replies[i] = r
  if not DECISIONS[i].admitted(r, argv) then
    break
  end
end
return replies
