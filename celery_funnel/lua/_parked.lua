-- _parked.lua: prepended to every parked-task script (park*.lua) by _stores/park.py
-- and by the other stores whose scripts touch parked tasks (leases, fair, copies, debounce).
-- KEYS (all eight, always in this order; one hash tag):
--   due          sorted set  task id -> release time (integer µs since the epoch)
--   entries      hash        task id -> the message to publish at release (JSON text)
--   claims       hash        task id -> token of the release that claimed it ("" = none)
--   leases       sorted set  task id -> end of a releaser's claim (µs)
--   accepted     hash        task id -> its copies: which copy of the task may go on
--                            (see read_copies below); and "origin\0<task id>" -> the
--                            origins of the messages checked, parked or moved under
--                            that id, each earlier one with its accepted copy
--                            (read_sends, same_message), kept as long as its record
--   accepted_at  sorted set  task id -> when that last changed (µs), to expire it
--   labels       hash        task id -> the funnel(s) that deferred it
--   counts       hash        label -> how many parked tasks it holds
local due, entries, claims, leases, accepted, accepted_at, labels, counts = unpack(KEYS)

-- the field of `accepted` that keeps the origin of the message first parked as `id`
local function origin_field(id)
  return 'origin\0' .. id
end

local function server_now()
  local clock = redis.call('TIME')
  return clock[1] * 1000000 + clock[2]
end

-- the entry is released, dropped or purged: delete it everywhere, count it out
local function forget(id)
  redis.call('ZREM', due, id)
  redis.call('ZREM', leases, id)
  redis.call('HDEL', entries, id)
  redis.call('HDEL', claims, id)
  local label = redis.call('HGET', labels, id)
  if label then
    redis.call('HDEL', labels, id)
    if redis.call('HINCRBY', counts, label, -1) <= 0 then
      redis.call('HDEL', counts, label)
    end
  end
end

-- The copies of one task, its `accepted` field, as one string:
--   (absent)     no copy of it was made or checked since its record expired
--   "+T"         copy T was accepted: it, and only it, may go on (T is "" for the
--                message as first sent, else the token the copy carries)
--   "+T>N M"     copy T, accepted, is being moved: copies N and M may have been published
--   "+T!"        copy T was accepted and started, and its ack failed (the broker died):
--                the broker delivering it again is dropped; a new message carrying T
--                (a retry of the run, sent from its body) goes on
--   ">N M"       copies N and M were published and none was accepted yet: the first
--                one accepted goes on, the others are dropped when they arrive
--   "parked"     the parked entry holds the task: every copy delivered is dropped
--   "gone"       purged or revoked while parked: every copy is dropped
-- A bare token, as an earlier version wrote it (a release not accepted yet), reads ">T".
local MOVES_KEPT = 8  -- pending copies remembered; an older one is dropped when it comes

-- the kind ("none", "copies", "ran", "parked", "gone"), owner (a token, or false) and
-- pending copies (a list of tokens) of task `id`
local function read_copies(id)
  local state = redis.call('HGET', accepted, id)
  if not state then
    return 'none', false, {}
  end
  if state == 'parked' or state == 'gone' then
    return state, false, {}
  end
  if string.sub(state, -1) == '!' then
    return 'ran', string.sub(state, 2, -2), {}
  end
  local owner, rest = false, state
  local head = string.sub(state, 1, 1)
  if head == '+' then
    local mark = string.find(state, '>', 1, true)
    owner = string.sub(state, 2, (mark or 0) - 1)
    rest = mark and string.sub(state, mark + 1) or ''
  elseif head == '>' then
    rest = string.sub(state, 2)
  end
  local pending = {}
  for token in string.gmatch(rest, '%S+') do
    pending[#pending + 1] = token
  end
  return 'copies', owner, pending
end

local function pending_has(pending, token)
  for _, each in ipairs(pending) do
    if each == token then
      return true
    end
  end
  return false
end

local function write_copies(id, state, now)
  redis.call('HSET', accepted, id, state)
  redis.call('ZADD', accepted_at, now, id)
end

-- the state of task `id` with `owner` (false: none) and `pending` (the newest kept)
local function copies_state(owner, pending)
  local first = math.max(#pending - MOVES_KEPT + 1, 1)
  local kept = {}
  for i = first, #pending do
    kept[#kept + 1] = pending[i]
  end
  local state = owner and ('+' .. owner) or ''
  if #kept > 0 then
    state = state .. '>' .. table.concat(kept, ' ')
  end
  return state
end

-- The messages under one id (field origin_field(id)): their origins, oldest first,
-- joined by "\0"; an earlier one keeps, after a "\1", the copy of it that was accepted
-- when the record moved on to a later one (none: every copy of it is stale).
local function read_sends(id)
  local sends = {}
  for entry in string.gmatch(redis.call('HGET', accepted, origin_field(id)) or '', '[^%z]+') do
    local mark = string.find(entry, '\1', 1, true)
    sends[#sends + 1] = mark and {string.sub(entry, 1, mark - 1), string.sub(entry, mark + 1)}
      or {entry, false}
  end
  return sends
end

local function write_sends(id, sends)
  local joined = {}
  for i, send in ipairs(sends) do
    joined[i] = send[2] and (send[1] .. '\1' .. send[2]) or send[1]
  end
  redis.call('HSET', accepted, origin_field(id), table.concat(joined, '\0'))
end

-- The record of `id` moves on to message `origin` (`at`: its place among `sends`, when an
-- earlier one; `carried`: its copy that was accepted), keeping the accepted copy of the
-- one it was about; 'busy' while that one is on its way (parked, or a copy published).
local function move_record(id, sends, at, origin, carried)
  local kind, owner, pending = read_copies(id)
  if kind == 'parked' or (kind == 'copies' and #pending > 0) then
    return 'busy'
  end
  sends[#sends][2] = kind == 'copies' and owner or false
  if at then
    table.remove(sends, at)
  end
  sends[#sends + 1] = {origin, false}
  write_sends(id, sends)
  if at then
    write_copies(id, '+' .. carried, server_now())
  else
    redis.call('HDEL', accepted, id)
    redis.call('ZREM', accepted_at, id)
  end
  return true
end

-- Whether a message carrying token `carried` ("" when none) and of `origin` is a copy
-- of the message the record of `id` is about. A message of an origin new to its id is a
-- task of its own (another send of the id, or Celery's `replace`, which gives the last
-- task of a chain, or the body of a chord, the replaced task's id); so is the copy of an
-- earlier message that was accepted when the record moved on (it may still wait, and
-- move). The record moves to it once the message it is about settled (a copy of it
-- accepted, none on its way); until then 'busy' (it waits: the record follows one
-- message at a time). False: a stale copy of an earlier message under this id.
local function same_message(id, carried, origin)
  if origin == '' then
    return true
  end
  local sends = read_sends(id)
  if #sends == 0 then
    write_sends(id, {{origin, false}})
    return true
  end
  local at = nil
  for i, send in ipairs(sends) do
    if send[1] == origin then
      at = i
    end
  end
  if at == #sends or (not at and carried ~= '') then
    return true  -- the latest message under this id (or a copy older than its origins)
  end
  if at and sends[at][2] ~= carried then
    return false  -- a copy of an earlier message under this id
  end
  return move_record(id, sends, at, origin, carried)
end

-- whether copy `token` may go on, the copies being (kind, owner, pending): the one
-- accepted, or a published one while none is; after a run whose ack failed, only a new
-- message carrying its token (`redelivered` false: a retry sent from its body)
local function may_go_on(kind, owner, pending, token, redelivered)
  if kind == 'none' then
    return true
  end
  if kind == 'ran' then
    return owner == token and not redelivered
  end
  if kind ~= 'copies' then
    return false
  end
  return owner == token or pending_has(pending, token)
end

-- records of copies long settled, at most `limit` of them; a task still parked keeps
-- its record
local function expire_copies(now, keep, limit)
  local old = redis.call('ZRANGEBYSCORE', accepted_at, '-inf', now - keep, 'LIMIT', 0, limit)
  for _, id in ipairs(old) do
    if redis.call('HEXISTS', entries, id) == 1 then
      redis.call('ZADD', accepted_at, now, id)
    else
      redis.call('ZREM', accepted_at, id)
      redis.call('HDEL', accepted, id, origin_field(id))
    end
  end
end

-- what a script about copy `token` of task `id` reads first, once the records of at most
-- 10 copies settled `keep` seconds ago are gone: nil when the message held is not the
-- task's, 'busy' when another send of its id is still on its way (same_message,
-- `origin`), else now (microseconds) and the kind, owner and pending copies of `id`
-- (read_copies)
local function open_copies(id, token, keep, origin)
  local now = server_now()
  expire_copies(now, keep, 10)
  local same = same_message(id, token, origin)
  if same ~= true then
    return same or nil
  end
  local kind, owner, pending = read_copies(id)
  return now, kind, owner, pending
end

-- A release claims the entry: the copy it publishes carries `token`, and the entry
-- stays until a worker accepts a copy; a claim not accepted within its lease is
-- claimed again (the copies published before stay valid: the first accepted goes on).
-- Each claim again lasts twice the one before (at most 16 times `lease`, µs), so that a
-- copy waiting in a long queue is not published again and again. Returns false when a
-- copy of the task was accepted already (the entry is forgotten).
local function claim_entry(id, token, now, lease)
  local kind, owner, pending = read_copies(id)
  if kind == 'copies' and owner then
    forget(id)  -- a copy runs already: its releaser died before the entry was forgotten
    return false
  end
  if kind ~= 'copies' then
    pending = {}
  end
  local longer = 2 ^ math.min(#pending, 4)
  pending[#pending + 1] = token
  write_copies(id, copies_state(false, pending), now)
  redis.call('ZREM', due, id)
  redis.call('ZADD', leases, now + lease * longer, id)
  redis.call('HSET', claims, id, token)
  return true
end
