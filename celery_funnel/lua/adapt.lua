-- adapt.lua: the adaptive rate of a GCRA funnel whose upstream publishes no limits:
-- on a refusal (HTTP 429) it drops multiplicatively, while calls succeed it climbs back
-- additively, at most one increase per `every`, within [min, max], shared by every worker.
-- After a refusal at rate R the climb stops one increase below R for `probe` (below
-- R * (1 + decrease) / 2 when R is under the last refusal's rate): the rate settles
-- under the upstream's limit instead of drawing a 429 on every climb.
--
-- KEYS[1]  the adaptive rates (hash: funnel key -> "t changed_at ceiling_t ceiling_at",
--          every field integer microseconds; no field: the funnel runs at its max)
-- ARGV[1]  the funnel key (the hash field)
-- ARGV[2]  the event: 1 refused (429), 2 succeeded
-- ARGV[3]  emission interval at the max rate, microseconds per unit (the code's rate)
-- ARGV[4]  emission interval at the min rate, microseconds per unit
-- ARGV[5]  decrease: the factor a refusal multiplies the rate by, parts per million
-- ARGV[6]  increase: what a climb adds to the rate, micro-units per second
-- ARGV[7]  every: the least time between two drops, and from any change to a climb,
--          microseconds
-- ARGV[8]  probe: how long a refusal's rate caps the climb, microseconds
-- ARGV[9]  now in microseconds since the epoch, or "" to use the server's TIME
-- Reply    {t, changed}: the emission interval now in force (microseconds per unit),
--          and 1 when this call changed it, else 0
-- Rates are 1e12 / t micro-units per second (doubles, as the Python twin computes them).

local fast, slow = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_us(ARGV[9])
local every = tonumber(ARGV[7])
local stored = redis.call('HGET', KEYS[1], ARGV[1])
local t, at, ceil_t, ceil_at = fast, now - every, 0, now - every
if stored then
  local a, b, c, d = string.match(stored, '^(%d+) (%d+) (%d+) (%d+)$')
  t, at, ceil_t, ceil_at = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
end
t = math.max(fast, math.min(slow, t))
-- a 429 waits `every` after the last drop (a burst of 429s counts once), a climb
-- after the last change of either kind
local since = now - at
if ARGV[2] == '1' then
  since = now - ceil_at
end
if since < every or (ARGV[2] == '2' and not stored) then
  return {t, 0}
end
local increase = tonumber(ARGV[6])
local new = t
if ARGV[2] == '1' then
  if stored and now - ceil_at < tonumber(ARGV[8]) and t > ceil_t then
    -- refused below the last refusal's rate: the limit fell, remember less than this
    -- rate, (1 + decrease) / 2 of it (TCP CUBIC's fast convergence, RFC 8312 4.6)
    ceil_t = math.ceil(t * 2e6 / (1e6 + tonumber(ARGV[5])))
  else
    ceil_t = t
  end
  ceil_at = now
  new = math.min(slow, math.ceil(t * 1e6 / tonumber(ARGV[5])))
else
  new = math.max(fast, math.floor(1e12 / (1e12 / t + increase)))
  if now - ceil_at < tonumber(ARGV[8]) then
    local below = 1e12 / ceil_t - increase
    local cap = t
    if below > 0 then
      cap = math.floor(1e12 / below)
    end
    new = math.min(t, math.max(new, cap))
  end
end
if new == t and ARGV[2] == '2' then
  return {t, 0}  -- capped: the climb waits, its clock left alone
end
if new <= fast and now - ceil_at >= tonumber(ARGV[8]) then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f %.0f %.0f %.0f', new, now, ceil_t, ceil_at))
end
if new == t then
  return {t, 0}
end
return {new, 1}
