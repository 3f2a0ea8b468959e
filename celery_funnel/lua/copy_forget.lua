-- copy_forget.lua: the messages of these runs, each as first sent and recorded as ended
-- before its late ack (copy_ran.lua, from _celery/late_ack.py), were acked: the broker
-- will not give them again, so their records go (else each would stay KEEP_SECONDS).
--
-- KEYS       the eight of _parked.lua
-- ARGV       task ids
-- Reply      how many records it removed
-- Only a record that says no more than that ("+!": the message as first sent ran, no
-- copy of it on its way) is removed; one that keeps anything else (copies published,
-- other sends of the id, a parked entry) stays until it expires.

local removed = 0
for _, id in ipairs(ARGV) do
  if redis.call('HGET', accepted, id) == '+!'
      and redis.call('HEXISTS', accepted, origin_field(id)) == 0
      and redis.call('HEXISTS', entries, id) == 0 then
    redis.call('HDEL', accepted, id)
    redis.call('ZREM', accepted_at, id)
    removed = removed + 1
  end
end
return removed
