package redisbroker

import "github.com/redis/go-redis/v9"

// The Lua scripts below are the broker's side of the Redis contract. Each runs atomically, so a
// request's keys never disagree (a live marker without its queued copy, a cancelled request
// that is still live). Go-redis runs them with EVALSHA and falls back to EVAL after a Redis
// restart emptied the script cache.

// submitScript enqueues a request unless a copy of it is live (an idempotent retry, or a waiter
// re-submitting after Redis lost its data) or a reusable result is stored.
//
//	KEYS: active, mailbox, cancel, queue
//	ARGV: token, active marker expiry (Unix ms), member, score, expired grace (ms)
//	returns {"live", token} | {"done", ""} | {"enqueued", token}
//
// A live marker whose remaining TTL is within the expired grace belongs to a request whose
// deadline passed: it is replaced. A stored result is reused when it is an HTTP answer below 500
// other than 429; any other (5xx, 429, an error code such as CANCELLED or DEADLINE_EXCEEDED) is
// cleared and the request runs again.
var submitScript = redis.NewScript(`
local live = redis.call('GET', KEYS[1])
if live and redis.call('PTTL', KEYS[1]) > tonumber(ARGV[5]) then
  return {'live', live}
end
local stored = redis.call('LINDEX', KEYS[2], 0)
if stored then
  local ok, res = pcall(cjson.decode, stored)
  if ok and type(res) == 'table' then
    local code = res['status_code']
    if type(code) == 'number' and code >= 200 and code < 500 and code ~= 429 then
      return {'done', ''}
    end
  end
  redis.call('DEL', KEYS[2])
end
redis.call('DEL', KEYS[3])
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[3])
return {'enqueued', ARGV[1]}
`)

// lookupScript reads a request's state.
//
//	KEYS: mailbox, active, cancel
//	ARGV: fetch grace (ms; -1 leaves the mailbox TTL alone, 0 deletes a fetched result), expired grace (ms)
//	returns {"ready", result} | {"pending", ""} | {"expired", ""} | {"cancelled", ""} | {"unknown", ""}
//
// A fetched result's TTL is shrunk to the fetch grace. The live marker outlives the deadline by
// the expired grace, so its remaining TTL tells a pending request from an expired one.
var lookupScript = redis.NewScript(`
local stored = redis.call('LINDEX', KEYS[1], 0)
if stored then
  local g = tonumber(ARGV[1])
  if g == 0 then
    redis.call('DEL', KEYS[1])
  elseif g > 0 then
    local t = redis.call('PTTL', KEYS[1])
    if t < 0 or t > g then redis.call('PEXPIRE', KEYS[1], g) end
  end
  return {'ready', stored}
end
local t = redis.call('PTTL', KEYS[2])
if t == -1 or t > tonumber(ARGV[2]) then return {'pending', ''} end
if t > 0 then return {'expired', ''} end
if redis.call('EXISTS', KEYS[3]) == 1 then return {'cancelled', ''} end
return {'unknown', ''}
`)

// cancelScript cancels the live copy of a request: its token moves to the cancel marker (which
// lives at least as long as the live marker would have), and the live marker goes, so the
// consumer drops a queued copy and aborts a running one.
//
//	KEYS: active, mailbox, cancel
//	ARGV: token ("" for whichever copy is live), "1" to delete the mailbox too, minimum marker TTL (ms)
//	returns 1 when a live copy was cancelled, else 0
var cancelScript = redis.NewScript(`
local live = redis.call('GET', KEYS[1])
local n = 0
if live and (ARGV[1] == '' or live == ARGV[1]) then
  local ttl = redis.call('PTTL', KEYS[1])
  local floor = tonumber(ARGV[3])
  if ttl < floor then ttl = floor end
  redis.call('SET', KEYS[3], live, 'PX', ttl)
  redis.call('DEL', KEYS[1])
  n = 1
end
if ARGV[2] == '1' then redis.call('DEL', KEYS[2]) end
return n
`)

// quotaAcquireScript takes one reserved slot of a tenant if its counter is below the limit.
//
//	KEYS: counter
//	ARGV: limit, window (s)
//	returns 1 (reserved) or 0 (overflow)
var quotaAcquireScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur >= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
`)

// quotaReleaseScript gives a slot back. A counter that reaches zero (or went negative because it
// expired during the request) is deleted.
//
//	KEYS: counter
//	ARGV: window (s)
//	returns the new count
var quotaReleaseScript = redis.NewScript(`
local v = redis.call('DECR', KEYS[1])
if v <= 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return v
`)
