-- A call stopped waiting for its admission (the store was slow, or the call's budget ran
-- out first). Its admit.lua may have run already, may still be on its way (the connection
-- it was sent on is gone, but the script reached the store's buffers), or never come: in
-- the first case what it took is given back now, in the others the tombstone makes it a
-- no-op when it comes. Idempotent: safe to send again when its answer is lost.
--
-- KEYS[1]  the run's hash, whose field `x:TOKEN` is the call's tombstone, its value the
--          time it expires (one key: see admit.lua)
-- ARGV     1 call token, 2 '1' when the call was never served (it counts as no call),
--          3 the tombstone's life in ms (the run's ttl)
--
-- Returns {given_back, ended_now, route, calls, used, age_ms, end}: given_back 1 when an
-- admission was given back, 0 when none had been made; ended_now 1 when the run's end is
-- to be counted by this call, whose admission's answer nobody read: the admission that
-- ended the run with no call in flight, or the last call in flight of a run that a
-- neighbour's refusal ended (as finish.lua does). Either makes the call the run's
-- `reporter`, so that this script sent again (its answer lost) answers the same.
local k = KEYS[1]
local function num(v) if v == nil or v == false or v == '' then return 0 end return tonumber(v) end
local function ended_now(given_back)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local e = redis.call('HMGET', k, 'route', 'calls', 'used', 'started', 'ended')
  local started = num(e[4])
  if started == 0 then started = now end
  return {given_back, 1, e[1] or '', num(e[2]), num(e[3]), now - started, e[5] or ''}
end
-- The tombstone lives the run's ttl, as long as an admission may be on its way: its value is
-- when it expires (by Redis's clock), and admit.lua prunes it after that as it gives back
-- expired reservations (`reclaim` holds the earliest of either). Kept for good, they grew a
-- run that lived through store hiccups by one field per failed call, read by every
-- admission (audit MD 3). The key lives at least as long.
local function tombstone()
  local t = redis.call('TIME')
  local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
  redis.call('HSET', k, 'x:' .. ARGV[1], at)
  local due = redis.call('HGET', k, 'reclaim')
  if not due or at < tonumber(due) then redis.call('HSET', k, 'reclaim', at) end
  if redis.call('PTTL', k) < tonumber(ARGV[3]) then redis.call('PEXPIRE', k, ARGV[3]) end
end
local held = redis.call('HGET', k, 'p:' .. ARGV[1])
if not held then
  tombstone()
  if redis.call('HGET', k, 'reporter') == ARGV[1] then return ended_now(0) end
  return {0}
end
redis.call('HDEL', k, 'p:' .. ARGV[1], 'e:' .. ARGV[1])
-- A copy of the admission still on its way (sent twice) must not admit the call again.
tombstone()
local h = redis.call('HMGET', k, 'in_flight', 'reserved', 'calls', 'unreported', 'ended',
  'max_calls')
local in_flight = math.max(0, num(h[1]) - 1)
redis.call('HSET', k, 'in_flight', in_flight, 'reserved', math.max(0, num(h[2]) - tonumber(held)))
if ARGV[2] == '1' then
  local calls = math.max(0, num(h[3]) - 1)
  redis.call('HSET', k, 'calls', calls)
  -- A refusal that found the calls all taken by calls that then gave theirs back ended
  -- nothing (a paused store runs queued admissions before their cancels): the run has a
  -- call again. Not counted yet, as calls were in flight when it came (`unreported`).
  if h[5] == 'calls' and h[4] == '1' and h[6] and h[6] ~= '' and calls < tonumber(h[6]) then
    redis.call('HDEL', k, 'ended', 'refused', 'unreported')
    h[4] = false
  end
end
-- Forgotten ttl after its last call, as finish.lua does (an admission kept the key alive
-- for the call's budget too).
if in_flight == 0 then redis.call('PEXPIRE', k, ARGV[3]) end
if in_flight == 0 and h[4] == '1' then
  redis.call('HDEL', k, 'unreported')
  redis.call('HSET', k, 'reporter', ARGV[1])
  return ended_now(1)
end
return {1, 0}
