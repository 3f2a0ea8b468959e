-- allowance.lua: take a worker's allowance, k units of one GCRA funnel in one call, while
-- the funnel stays far from full; else nothing here, and reserve.lua's decision follows
-- unchanged (this file is its head: _limiter/strategies/allowance.py joins them).
--
-- KEYS[1], KEYS[2]  as reserve.lua's (tickets, ranks): not touched here
-- KEYS[3]  the funnel: a string holding its TAT, integer microseconds since the epoch
--          (shared with gcra.lua and reserve.lua); only one funnel is ever taken from
-- ARGV[1..10]  as reserve.lua's with one funnel: ARGV[1] now ("" = the server's
--          TIME), ARGV[3] redeem, ARGV[8] the increment of one unit (T, us), ARGV[9]
--          the tolerance tau (T * limit, us)
-- ARGV[11] k, the units wanted (an integer, 2 or more; absent or less: nothing taken)
-- Reply    {0, 0, reset_after (us), 0, k} when the k units are taken: the TAT moved
--          k * T later and is still at most tau / 2 ahead of now (at least half the
--          burst tolerance free after the charge); otherwise reserve.lua's own reply
--          for one unit ({status, delay, reset_after, stale}: four entries)
-- Units    microseconds for every time; k and the reply's fifth entry in units

do
  local k = tonumber(ARGV[11])
  if k and k > 1 and #KEYS == 3 and ARGV[3] ~= '1' then
    local now = now_us(ARGV[1])
    local tat = tonumber(redis.call('GET', KEYS[3])) or now
    if tat < now then
      tat = now
    end
    local after = tat + k * tonumber(ARGV[8])
    if (after - now) * 2 <= tonumber(ARGV[9]) then
      redis.call('SET', KEYS[3], string.format('%.0f', after), 'PX', math.ceil((after - now) / 1000))
      return {0, 0, after - now, 0, k}
    end
  end
end
