-- fair_admit.lua: the gate's admission of a task on a fair funnel.
--
-- KEYS     the ten of _fair.lua
-- ARGV[1]  now in microseconds since the epoch, or "" to use the server's TIME
-- ARGV[2]  task id (its ticket, when the dispatcher booked it a slot)
-- ARGV[3]  increment = T * cost, µs
-- ARGV[4]  tolerance tau = T * capacity, µs
-- ARGV[5]  early grace, µs: a booked ticket is honoured from slot - early ...
-- ARGV[6]  late grace, µs: ... to slot + late
-- ARGV[7]  the task's tenant (for the admissions count)
-- Reply    {0, 0}: admitted (its booked slot, or a free unit of an idle funnel);
--          {1, delay µs}: its slot is booked, come back then;
--          {2, 0}: join the waiting queue; {2, 1}: join it in front (its slot was
--          missed: it keeps its turn); {3, -1}: the cost can never fit
-- A task is admitted at once only when no task of the funnel waits: a funnel with
-- waiting tasks hands its slots out through the dispatcher (fair_pop.lua) alone.

local now = now_us(ARGV[1])
local id = ARGV[2]
local missed = 0
local booked = tonumber(redis.call('ZSCORE', tickets, id))
if booked then
  if now < booked - tonumber(ARGV[5]) then
    return {1, booked - now}
  end
  redis.call('ZREM', tickets, id)
  if now <= booked + tonumber(ARGV[6]) then
    return {0, 0}  -- counted by the dispatcher, in its slot's second
  end
  missed = 1  -- honoured this late, tickets released together would burst
end
local inc, tau = tonumber(ARGV[3]), tonumber(ARGV[4])
if inc > tau then
  return {3, -1}
end
if redis.call('ZCARD', tenants) > 0 then
  return {2, missed}
end
local tat = tonumber(redis.call('GET', funnel)) or now
if tat < now then
  tat = now
end
local new_tat = tat + inc
if new_tat - tau > now then
  return {2, missed}
end
redis.call('SET', funnel, string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
count(ARGV[7], now)
return {0, 0}
