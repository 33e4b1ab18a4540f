-- The end of one call of a run, as one atomic step (src/runs/state.rs, RunState::finish):
-- its reservation becomes what it used, and the repeats of its answer and request are
-- followed.
--
-- KEYS[1]  the run's hash
-- ARGV     1 reserve, 2 tokens used, 3 answer: '' none read (the streak stands), '-' one
--          without a tool call (it breaks the streak), else its tool calls' fingerprint;
--          4 tool name, 5 ttl_ms, 6 request fingerprint ('' when it does not count),
--          7 the call's token, 8 the run's generation as its admission said it (admit.lua;
--          '' or absent: a run a previous release started, or a previous release's call)
--
-- Returns {ended_now, route, calls, used, age_ms, end}; {-1} when the run is gone and this
-- call is the first to find it so (it counts the loss); {} when it has nothing to give back.
-- ended_now: the run has ended and this was its last call in flight: its end is counted by
-- this call, which becomes the run's `reporter`. Sent again (its answer lost), it answers
-- the same: the gateway reads one answer per call, so the end is counted once.
local k = KEYS[1]
-- The run is gone: its key was evicted (a maxmemory-policy other than noeviction), flushed,
-- or expired while this end waited on a store that was down. The first call to find it so
-- counts the loss, and marks the key with its token (`lost`) for the ttl, as long as the run
-- would have lived: the run's other calls in flight find the mark and count nothing, and
-- this script sent again answers the same (audit VA 3: no end said anything). A new run
-- under the same id starts in the marked key and lets the mark be.
--
-- A call that knows its run's generation marks the loss of that generation (`l:GEN`), not of
-- the key: the run may be started over in the key before the lost run's calls end (a new
-- call of the same id, as agents make calls in parallel), and their ends must still tell
-- their run gone from the new one, each generation lost counted once (audit VC 6).
local gen = ARGV[8] or ''
local lost_mark = gen == '' and 'lost' or ('l:' .. gen)
if redis.call('EXISTS', k) == 0 then
  redis.call('HSET', k, lost_mark, ARGV[7])
  redis.call('PEXPIRE', k, tonumber(ARGV[5]))
  return {-1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = {}
local raw = redis.call('HGETALL', k)
for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
-- The key holds another generation (a run started over), or none (only marks, or a
-- tombstone): this call's run is gone. Counted by the first of its calls to find it so; the
-- new run's fields are left as they are, and the key lives at least the ttl for the mark.
if gen ~= '' and h.gen ~= gen then
  local mark = h[lost_mark]
  if mark == ARGV[7] then return {-1} end
  -- Counted already: by another call of the run, or (during a rolling upgrade) by a
  -- previous release's call of it, whose mark names no generation.
  if mark ~= nil or (h.gen == nil and h.lost ~= nil) then return {} end
  redis.call('HSET', k, lost_mark, ARGV[7])
  if redis.call('PTTL', k) < tonumber(ARGV[5]) then redis.call('PEXPIRE', k, tonumber(ARGV[5])) end
  return {-1}
end
local function num(v) if v == nil or v == '' then return nil end return tonumber(v) end
-- Given back once: a call that cancel.lua already gave back has nothing left to give.
if redis.call('HDEL', k, 'p:' .. ARGV[7]) == 0 then
  if h.lost == ARGV[7] then return {-1} end
  if h.reporter == ARGV[7] then
    return {1, h.route, num(h.calls) or 0, num(h.used) or 0, now - (num(h.started) or now),
      h.ended or ''}
  end
  return {}
end
redis.call('HDEL', k, 'e:' .. ARGV[7])
local in_flight = math.max(0, (num(h.in_flight) or 0) - 1)
local reserved = math.max(0, (num(h.reserved) or 0) - tonumber(ARGV[1]))
local used = (num(h.used) or 0) + tonumber(ARGV[2])
redis.call('HSET', k, 'in_flight', in_flight, 'reserved', reserved, 'used', used, 'last', now)
if ARGV[3] == '-' then
  redis.call('HDEL', k, 'ans_fp', 'ans_tool', 'ans_n')
elseif ARGV[3] ~= '' then
  if h.ans_fp == ARGV[3] then
    redis.call('HINCRBY', k, 'ans_n', 1)
  else
    redis.call('HSET', k, 'ans_fp', ARGV[3], 'ans_tool', ARGV[4], 'ans_n', 1)
  end
end
if ARGV[6] ~= '' then
  if h.req_fp == ARGV[6] then
    redis.call('HINCRBY', k, 'req_n', 1)
  else
    redis.call('HSET', k, 'req_fp', ARGV[6], 'req_n', 1)
  end
end
local ended = h.ended
local max_tokens = num(h.max_tokens)
if max_tokens ~= nil and used >= max_tokens and (ended == nil or ended == '') then
  ended = 'tokens'
  redis.call('HSET', k, 'ended', ended,
    'refused', cjson.encode({'tokens', max_tokens, used, reserved, 0}), 'unreported', 1)
  h.unreported = '1'
end
-- A run's end is counted once no call of it is in flight: with what every call used.
local ended_now = 0
if in_flight == 0 and h.unreported == '1' then
  redis.call('HDEL', k, 'unreported')
  redis.call('HSET', k, 'reporter', ARGV[7])
  ended_now = 1
end
-- Forgotten ttl after its last call: exactly that once no call is in flight (an admission
-- kept the key alive for the call's budget too); while one is, never shorter.
local ttl = tonumber(ARGV[5])
if in_flight == 0 or redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
return {ended_now, h.route, num(h.calls) or 0, used, now - (num(h.started) or now), ended or ''}
