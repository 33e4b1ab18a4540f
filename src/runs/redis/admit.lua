-- Admission of one call into its run, as one atomic step (the same rules as
-- src/runs/state.rs, RunState::admit; the store tests hold both stores to them).
--
-- KEYS[1]  the run's hash (hash-tagged: one Redis Cluster slot per run), its one key: a
--          script of two keys, one of them missing, is refused with TRYAGAIN all the while
--          its slot migrates. Its field `x:TOKEN` is this call's tombstone, set by cancel.lua
--          when the call stopped waiting for this admission, so that an admission run later
--          changes nothing (its value: when it expires, past which the reclaim below prunes
--          it); a hash with no `route` is no run yet (a tombstone alone).
-- ARGV     1 route, 2 budget_ms, 3 max_budget_ms, 4 max_calls, 5 max_tokens,
--          6 max_repeats, 7 token_estimate ('' for unset): the limits a new run takes,
--          as does one whose limits are not fixed yet (below);
--          8 reserve, 9 asked_budget_ms (''), 10 request fingerprint (''), 11 need_ms,
--          12 since_arrival_ms, 13 expire_ms (ttl plus this call's budget), 14 call token,
--          15 life_ms: how long after the call's arrival its reservation is given back if
--          its end never comes ('' for never)
--
-- Returns {1, deadline_ms, calls_left, tokens_left, allowance, run_budget_ms, started,
--          max_tokens, max_repeats, route, gen} (max_tokens and max_repeats the run's limits,
--          which the call is held to, -1 for none; route the run's; gen its generation,
--          which the call's end gives finish.lua), {0, ended_now, deadline_ms, calls_left, tokens_left, route,
--          refusal...}, or {2} for a call already cancelled. ended_now: the run ended with
--          this refusal and no call in flight, so its end is counted now (else the last
--          call to finish counts it). deadline_ms: the run's deadline after this call's
--          arrival (-1 for none), which the gateway counts from when the call arrived there,
--          not from when this reply is back: the time left now would be late by the trip
--          back, and the arrival here is late by the trip here (audit KD 1: a 3 s run cut at
--          3.30 s through 150 ms each way). The call that starts the run gets its budget
--          exactly; a later one errs early by its trip here, never late.
local k = KEYS[1]
if redis.call('HEXISTS', k, 'x:' .. ARGV[14]) == 1 then return {2} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local arrival = now - tonumber(ARGV[12])
local fresh = redis.call('HEXISTS', k, 'route') == 0
if fresh then
  redis.call('HSET', k, 'route', ARGV[1], 'budget', ARGV[2], 'max_budget', ARGV[3],
    'max_calls', ARGV[4], 'max_tokens', ARGV[5], 'max_repeats', ARGV[6],
    'estimate', ARGV[7], 'started', arrival, 'calls', 0, 'in_flight', 0, 'used', 0,
    'reserved', 0, 'last', now)
end
local raw = redis.call('HGETALL', k)
local h = {}
for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
-- The run's generation: the token of the call that started it (or, in a run a previous
-- release started, of its first call here). Each admitted call carries it back to
-- finish.lua, which tells by it a run that is still the call's from one started over in the
-- same key after the call's was lost (audit VC 6). A previous release reads past it.
if h.gen == nil then
  redis.call('HSET', k, 'gen', ARGV[14])
  h.gen = ARGV[14]
end
local function num(v) if v == nil or v == '' then return nil end return tonumber(v) end
-- A run whose calls so far came on routes without run keys has no limits yet: the first call
-- on a route that has some fixes them, and names the run's route from then on (state.rs,
-- RunState::take_limits; audit SF 1). The same fields a new run is given: a replica still
-- running the script before this one reads such a run as before (and fixes nothing). A run
-- that has ended keeps its route and limits (audit TB 3): its end is counted under them.
local function unset(v) return v == nil or v == '' end
local adopted = false
if not fresh and unset(h.ended) and unset(h.budget) and unset(h.max_budget) and unset(h.max_calls)
    and unset(h.max_tokens) and unset(h.max_repeats)
    and not (ARGV[2] == '' and ARGV[3] == '' and ARGV[4] == '' and ARGV[5] == '' and ARGV[6] == '') then
  redis.call('HSET', k, 'route', ARGV[1], 'budget', ARGV[2], 'max_budget', ARGV[3],
    'max_calls', ARGV[4], 'max_tokens', ARGV[5], 'max_repeats', ARGV[6], 'estimate', ARGV[7])
  h.route, h.budget, h.max_budget, h.max_calls = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
  h.max_tokens, h.max_repeats, h.estimate = ARGV[5], ARGV[6], ARGV[7]
  adopted = true
end
local budget, max_budget = num(h.budget), num(h.max_budget)
local max_calls, max_tokens, max_repeats = num(h.max_calls), num(h.max_tokens), num(h.max_repeats)
local calls, used, reserved = num(h.calls), num(h.used), num(h.reserved)
local deadline, run_budget = num(h.deadline), num(h.run_budget)
local started_ms = num(h.started)
local reserve, asked, need = tonumber(ARGV[8]), num(ARGV[9]), tonumber(ARGV[11])
local request = ARGV[10]
local in_flight = num(h.in_flight) or 0

-- Reservations whose end never came (a replica killed mid-call, a store restored from an
-- older snapshot, an end given up after its retries): each has an expiry (`e:TOKEN`), past
-- which its call has ended and its end been tried, and is given back here. Cancel
-- tombstones (`x:TOKEN`) past their expiry are pruned here too (one without a time, as
-- cancel.lua once left them, at once). `reclaim` holds the earliest expiry of either, so the
-- fields are looked through only once one has passed.
local due = num(h.reclaim)
if due ~= nil and due <= now then
  local gone, next_due = {}, nil
  for f, v in pairs(h) do
    if string.sub(f, 1, 2) == 'e:' then
      local token = string.sub(f, 3)
      local held, at = num(h['p:' .. token]), tonumber(v)
      if held == nil then
        table.insert(gone, f)
      elseif at <= now then
        table.insert(gone, f)
        table.insert(gone, 'p:' .. token)
        in_flight = math.max(0, in_flight - 1)
        reserved = math.max(0, reserved - held)
      elseif next_due == nil or at < next_due then
        next_due = at
      end
    elseif string.sub(f, 1, 2) == 'x:' then
      local at = tonumber(v)
      if at == nil or at <= now then
        table.insert(gone, f)
      elseif next_due == nil or at < next_due then
        next_due = at
      end
    end
  end
  for _, f in ipairs(gone) do h[f] = nil end
  if #gone > 0 then redis.call('HDEL', k, unpack(gone)) end
  redis.call('HSET', k, 'in_flight', in_flight, 'reserved', reserved)
  h.in_flight = tostring(in_flight)
  due = next_due
  if due == nil then redis.call('HDEL', k, 'reclaim') else redis.call('HSET', k, 'reclaim', due) end
  -- The run ended while those calls were in flight: its end is counted now, by this call
  -- (refused, as the run has ended), as the last of them would have counted it.
  if in_flight == 0 and h.unreported == '1' then
    redis.call('HDEL', k, 'unreported')
    redis.call('HSET', k, 'reporter', ARGV[14])
    h.unreported, h.reporter = nil, ARGV[14]
  end
end

-- The route's budget, which the client's may only shorten; without one, the client's,
-- clamped by max_budget (as state.rs: RunState::budget_for).
local function budget_for(a)
  if a ~= nil then
    if budget ~= nil and a > budget then a = budget end
    if max_budget ~= nil and a > max_budget then a = max_budget end
    return a
  end
  return budget
end

-- A run_budget taken with the limits counts from the run's first call's arrival (one deadline
-- per run); a deadline a client set before may only shorten it (RunState::take_limits). A run
-- with no call yet (its first ones withdrawn) starts with this one, below.
if adopted and not (calls == 0 and deadline == nil) then
  run_budget = budget_for(run_budget)
  if run_budget ~= nil then deadline = started_ms + run_budget end
end

local started = calls == 0 and (h.ended == nil or h.ended == '') and deadline == nil
if started then
  run_budget = budget_for(asked)
  if run_budget ~= nil then deadline = arrival + run_budget end
elseif asked ~= nil then
  local at = arrival + budget_for(asked)
  if deadline == nil or at < deadline then
    deadline = at
    run_budget = at - started_ms
  end
end
if deadline ~= nil then
  redis.call('HSET', k, 'deadline', deadline, 'run_budget', run_budget)
end

local function left_of(limit, n) if limit == nil then return -1 end return math.max(0, limit - n) end
local function view_tokens() if max_tokens == nil then return -1 end return math.max(0, max_tokens - used - reserved) end
local function deadline_left() if deadline == nil then return -1 end return math.max(0, deadline - now) end
local function deadline_ms() if deadline == nil then return -1 end return math.max(0, deadline - arrival) end

-- This call's admission ran already: its answer was lost and it was sent again (redis.rs
-- sends it twice when the connection dropped under it). The same answer, nothing taken twice.
local held = h['p:' .. ARGV[14]]
if held then
  local allowance = -1
  if max_tokens ~= nil then allowance = math.max(0, max_tokens - (used + reserved - tonumber(held))) end
  return {1, deadline_ms(), left_of(max_calls, calls), view_tokens(), allowance,
    run_budget or -1, h.starter == ARGV[14] and 1 or 0, max_tokens or -1, max_repeats or -1,
    h.route, h.gen}
end

-- The refusal, as a list: the kind, then what the message needs.
local refusal = nil
if h.refused ~= nil and h.refused ~= '' then
  refusal = cjson.decode(h.refused)
  -- What the run holds now, and this call's reservation, not the ended run's numbers; the
  -- time left now, not at the refusal that ended it.
  -- The limit is the run's own field: cjson wrote the refusal's numbers to 14 digits.
  if refusal[1] == 'tokens' then refusal = {'tokens', max_tokens or refusal[2], used, reserved, reserve} end
  if refusal[1] == 'deadline' then refusal = {'deadline', refusal[2], math.max(0, deadline_left())} end
end
if refusal == nil and deadline ~= nil then
  local left = deadline - now
  if left <= 0 or left < need then
    refusal = {'deadline', run_budget or 0, math.max(0, left)}
  end
end
if refusal == nil and max_calls ~= nil and calls >= max_calls then
  refusal = {'calls', max_calls}
end
if refusal == nil and max_repeats ~= nil then
  local n = num(h.ans_n)
  if n ~= nil and n >= max_repeats then
    refusal = {'loop', h.ans_fp, h.ans_tool or '', n}
  elseif request ~= '' and h.req_fp == request and num(h.req_n) >= max_repeats then
    refusal = {'loop', h.req_fp, '', num(h.req_n)}
  end
end
if refusal == nil and max_tokens ~= nil and used + reserved + reserve > max_tokens then
  refusal = {'tokens', max_tokens, used, reserved, reserve}
end

if refusal ~= nil then
  local ended_now = 0
  local exhausted = max_tokens ~= nil and used >= max_tokens
  if refusal[1] ~= 'tokens' or exhausted then
    if h.ended == nil or h.ended == '' then
      redis.call('HSET', k, 'ended', refusal[1], 'refused', cjson.encode(refusal))
      -- Counted once the calls still in flight have added what they used (finish.lua).
      if in_flight == 0 then
        ended_now = 1
        -- Should this call have stopped waiting, its cancel.lua counts the end instead.
        redis.call('HSET', k, 'reporter', ARGV[14])
      else
        redis.call('HSET', k, 'unreported', 1)
      end
    end
  end
  -- Sent again, the refusal that counted the end says so again (only one answer is read).
  if ended_now == 0 and h.reporter == ARGV[14] then ended_now = 1 end
  if fresh then redis.call('PEXPIRE', k, ARGV[13]) end
  local out = {0, ended_now, deadline_ms(), left_of(max_calls, calls), view_tokens(),
    h.route, calls, used, now - started_ms}
  -- Numbers as whole integers: `tostring` keeps 14 significant digits (audit WD 3).
  for _, v in ipairs(refusal) do
    if type(v) == 'number' then v = string.format('%.0f', v) else v = tostring(v) end
    table.insert(out, v)
  end
  return out
end

calls = calls + 1
reserved = reserved + reserve
redis.call('HSET', k, 'calls', calls, 'reserved', reserved, 'last', now)
redis.call('HINCRBY', k, 'in_flight', 1)
-- What this call holds, until finish.lua or cancel.lua gives it back (once).
redis.call('HSET', k, 'p:' .. ARGV[14], reserve)
local life = num(ARGV[15])
if life ~= nil then
  local at = arrival + life
  redis.call('HSET', k, 'e:' .. ARGV[14], at)
  if due == nil or at < due then redis.call('HSET', k, 'reclaim', at) end
end
if started then redis.call('HSET', k, 'starter', ARGV[14]) end
local expire = tonumber(ARGV[13])
if redis.call('PTTL', k) < expire then redis.call('PEXPIRE', k, expire) end
local allowance = -1
if max_tokens ~= nil then allowance = math.max(0, max_tokens - (used + reserved - reserve)) end
return {1, deadline_ms(), left_of(max_calls, calls), view_tokens(), allowance,
  run_budget or -1, started and 1 or 0, max_tokens or -1, max_repeats or -1, h.route, h.gen}
