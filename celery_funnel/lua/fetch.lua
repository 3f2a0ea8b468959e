-- fetch.lua: the broker transport's fetch. Take one message off the first non-empty
-- queue list, in the order given (kombu's: priority steps, then queues in their cycle's
-- order), and record it as un-acked in the same call, as kombu's QoS.append records it
-- (kombu's own transport takes it with BRPOP and records it a round trip later: between
-- the two the message lives only in the worker's memory).
--
-- KEYS[1]            unacked: hash, delivery tag -> JSON [message, exchange, routing key]
-- KEYS[2]            unacked_index: zset, delivery tag -> when it was taken
-- KEYS[3 .. 2+n]     the queue lists, in the order to take from (n = ARGV[2])
-- KEYS[3+n ..]       the wake markers of the lists' queues (lists of "1"s), each once
-- ARGV[1]            now: the consumer's clock, seconds since the epoch (a float: the
--                    score kombu writes and its restore compares)
-- ARGV[2]            n, how many queue lists
-- ARGV[3 .. 2+n]     per queue list: "1" record what is taken (a consumer that acks),
--                    "0" do not (a no-ack consumer: pidbox replies)
-- ARGV[3+n .. 2+2n]  per queue list: the index of its queue's marker among the markers
-- Reply   nil when every list is empty (their markers are then cleared), else
--         {i, message, recorded}: i the 1-based index of the list taken from, the
--         message as it was stored, recorded 1 when its un-acked record was written (0:
--         a no-ack list, or a message whose delivery tag or routing cannot be read,
--         which the consumer then records itself, as kombu does)
-- Errors  a record Redis refuses to write (OOM under noeviction): nothing is taken
-- Units   seconds (ARGV[1]), as kombu's QoS.append writes them

local n = tonumber(ARGV[2])

-- The delivery tag, exchange and routing key of ``message``, or nil. The body, most of
-- a message, is skipped unread where the message starts with it (kombu's layout): only
-- the rest is decoded. Anything else is decoded whole.
local function routing(message)
  local decoded
  local _, open = string.find(message, '^{%s*"body"%s*:%s*"')
  if open then
    local at = open + 1
    -- the body's closing quote: a plain find (memchr), as a pattern's class is
    -- matched a character at a time (16 ms for a 1 MB body, against 1 ms)
    local hit = string.find(message, '"', at, true)
    while hit do
      local back = hit - 1
      while back >= at and string.byte(message, back) == 92 do -- 92: a backslash
        back = back - 1
      end
      if (hit - 1 - back) % 2 == 0 then
        break -- not escaped: an even run of backslashes before it
      end
      hit = string.find(message, '"', hit + 1, true)
    end
    local comma = hit and string.find(message, '^%s*,', hit + 1)
    if comma then
      local ok, rest = pcall(cjson.decode, '{' .. string.sub(message, comma + 1))
      if ok and type(rest) == 'table' and type(rest.properties) == 'table' then
        decoded = rest
      end
    end
  end
  if not decoded then
    local ok, whole = pcall(cjson.decode, message)
    if not (ok and type(whole) == 'table' and type(whole.properties) == 'table') then
      return nil
    end
    decoded = whole
  end
  local properties = decoded.properties
  local delivery = properties.delivery_info
  if type(properties.delivery_tag) ~= 'string' or type(delivery) ~= 'table' then
    return nil
  end
  return properties.delivery_tag, delivery.exchange, delivery.routing_key
end

-- Write ``message``'s un-acked record; false and Redis's error when it refused.
local function record(message)
  local tag, exchange, routing_key = routing(message)
  if not tag then
    return false
  end
  local entry = '[' .. message .. ', ' .. cjson.encode(exchange) .. ', '
    .. cjson.encode(routing_key) .. ']'
  local written = redis.pcall('HSET', KEYS[1], tag, entry)
  if type(written) == 'table' and written.err then
    return false, written.err
  end
  local indexed = redis.pcall('ZADD', KEYS[2], ARGV[1], tag)
  if type(indexed) == 'table' and indexed.err then
    redis.pcall('HDEL', KEYS[1], tag)
    return false, indexed.err
  end
  return true
end

for i = 1, n do
  local list = KEYS[2 + i]
  -- read, record, then remove: a refused record leaves the message where it was
  local message = redis.call('LINDEX', list, -1)
  if message then
    local recorded, refused = false, nil
    if ARGV[2 + i] == '1' then
      recorded, refused = record(message)
      if refused then
        return redis.error_reply(refused)
      end
    end
    redis.call('LTRIM', list, 0, -2)
    local which = tonumber(ARGV[2 + n + i])
    local marker = KEYS[2 + n + which]
    redis.call('RPOP', marker)
    return {i, message, recorded and 1 or 0}
  end
end
for i = 3 + n, #KEYS do
  local marker = KEYS[i]
  redis.call('DEL', marker)
end
return nil
