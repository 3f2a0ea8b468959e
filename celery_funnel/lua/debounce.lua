-- debounce.lua: one send of a debounced task (funnel_debounce): its message waits
-- among the parked tasks, replacing the one its key's open window holds, until no send
-- came for the debounce time (or the window's most), when a releaser publishes it.
--
-- KEYS     the eight of _parked.lua, then KEYS[9]: the key's window (string "<task id>
--          <first send µs>"; open while its entry waits unclaimed, never released)
-- ARGV[1]  the task id the message carries
-- ARGV[2]  "1" when that id is new (no task had it), "0" when it names the window the
--          sender expects to join
-- ARGV[3]  wait after this send, µs (funnel_debounce)
-- ARGV[4]  most after the window's first send, µs (funnel_debounce_max), -1 for none
-- ARGV[5]  the message (JSON text)
-- ARGV[6]  the label it is counted under (parked counts)
-- ARGV[7]  lead, µs: releasers claim entries this early, so the entry is due this late
-- ARGV[8]  how long a window record outlives its release, µs
-- Reply    {1, task id, release time µs, 1 when this send opened the window else 0};
--          {0, id of the open window, or "" when none is open}: nothing changed, send
--          again with that id (a new id for "")

local window = KEYS[9]
local now = server_now()
local open, first = nil, now
local record = redis.call('GET', window)
if record then
  local id, at = string.match(record, '^(%S+) (%d+)$')
  -- open while its entry waits unclaimed and was never released (a released run that
  -- a gate parked again, for a rate or a slot, has an acceptance record: closed)
  if id and redis.call('HGET', claims, id) == '' and redis.call('HEXISTS', accepted, id) == 0 then
    open, first = id, tonumber(at)
  end
end
local id = ARGV[1]
if open and open ~= id then
  return {0, open}
end
if not open and ARGV[2] ~= '1' then
  return {0, ''}
end
local release = now + tonumber(ARGV[3])
local most = tonumber(ARGV[4])
if most >= 0 then
  release = math.max(math.min(release, first + most), now)
end
if not open then
  redis.call('HSET', labels, id, ARGV[6])
  redis.call('HINCRBY', counts, ARGV[6], 1)
end
redis.call('ZADD', due, string.format('%.0f', release + tonumber(ARGV[7])), id)
redis.call('HSET', entries, id, ARGV[5])
redis.call('HSET', claims, id, '')
local keep_ms = math.ceil((release - now + tonumber(ARGV[8])) / 1000)
redis.call('SET', window, id .. ' ' .. string.format('%.0f', first), 'PX', keep_ms)
return {1, id, string.format('%.0f', release), open and 0 or 1}
