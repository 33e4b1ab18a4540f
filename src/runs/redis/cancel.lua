-- A call stopped waiting for its admission (the store was slow, or the call's budget ran
-- out first). Its admit.lua may have run already, may still be on its way (the connection
-- it was sent on is gone, but the script reached the store's buffers), or never come: in
-- the first case what it took is given back now, in the others the tombstone makes it a
-- no-op when it comes. Idempotent: safe to send again when its answer is lost.
--
-- KEYS[1]  the run's hash; KEYS[2] the call's tombstone (same hash tag)
-- ARGV     1 call token, 2 '1' when the call was never served (it counts as no call),
--          3 the tombstone's life in ms (the run's ttl)
--
-- Returns 1 when an admission was given back, 0 when none had been made.
local k = KEYS[1]
local held = redis.call('HGET', k, 'p:' .. ARGV[1])
if not held then
  redis.call('SET', KEYS[2], 1, 'PX', ARGV[3])
  return 0
end
redis.call('HDEL', k, 'p:' .. ARGV[1])
local function num(v) if v == nil or v == false or v == '' then return 0 end return tonumber(v) end
local h = redis.call('HMGET', k, 'in_flight', 'reserved', 'calls')
redis.call('HSET', k, 'in_flight', math.max(0, num(h[1]) - 1),
  'reserved', math.max(0, num(h[2]) - tonumber(held)))
if ARGV[2] == '1' then
  redis.call('HSET', k, 'calls', math.max(0, num(h[3]) - 1))
end
return 1
