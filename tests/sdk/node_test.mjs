// End-to-end checks of Hourglass with the official OpenAI and Anthropic Node SDKs as clients.
//
// Run by tests/sdk/run.sh after the Python checks, against the same gateway and fake provider:
//   HOURGLASS_SDK_BASE_URL     the gateway, e.g. http://127.0.0.1:PORT
//   HOURGLASS_SDK_ADMIN_URL    its admin listener (for /metrics)
//   HOURGLASS_SDK_FAKE_URL     the fake provider itself, asked directly to compare answers
//   HOURGLASS_SDK_NODE_MODULES the node_modules directory the SDKs are installed in
//   HOURGLASS_SDK_RESULT       optional: a file to receive "PASSED FAILED"
//
// The Node SDKs differ from the Python ones in what the gateway sees and what it must do:
// they send only `X-Stainless-Timeout`, in whole seconds (Math.trunc), and their timeout covers
// the wait for the response head only; once a stream is open, nothing on the client side ends
// a silence. So the gateway's idle limit, capped below that patience, is the only thing that
// can. And they talk through undici's fetch, whose `break` out of a stream aborts the request:
// that must reach the upstream as a cancellation with origin `client`.
//
// Every client uses maxRetries: 0, so an SDK retry never hides a failure or slows the run.

import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";
import { readFileSync, writeFileSync } from "node:fs";
import { isDeepStrictEqual } from "node:util";

const require = createRequire(process.env.HOURGLASS_SDK_NODE_MODULES.replace(/\/?$/, "/"));
const OpenAI = require("openai");
const Anthropic = require("@anthropic-ai/sdk");

const BASE_URL = process.env.HOURGLASS_SDK_BASE_URL.replace(/\/$/, "");
const ADMIN_URL = process.env.HOURGLASS_SDK_ADMIN_URL.replace(/\/$/, "");
const FAKE_URL = process.env.HOURGLASS_SDK_FAKE_URL.replace(/\/$/, "");
const RESULT_FILE = process.env.HOURGLASS_SDK_RESULT;

const FIRST_TOKEN_TIMEOUT = 3.0; // the route's first_token_timeout in run.sh's config
const TOKENS = [1, 2, 3, 4, 5].map((n) => `tok${n} `);
const MESSAGES = [{ role: "user", content: "hi" }];
// 30 s of patience (X-Stainless-Timeout: 30), well above the route's own limits.
const PATIENT_MS = 30_000;
// The impatient client: X-Stainless-Timeout: 2, the Node SDKs' wait for the head. Once the
// head has come they wait as long as the stream lasts, so Hourglass bounds only the head by
// it; the idle check runs on a route whose own idle limit is 2 s (model "quick").
const IMPATIENT_MS = 2_000;

class CheckFailed extends Error {}

function expect(cond, what) {
  if (!cond) throw new CheckFailed(what);
}

const now = () => performance.now() / 1000;

const openai = (timeout = PATIENT_MS, base = BASE_URL) =>
  new OpenAI({ baseURL: `${base}/v1`, apiKey: "sk-sdk-test", maxRetries: 0, timeout });
const anthropic = (timeout = PATIENT_MS) =>
  new Anthropic({ baseURL: BASE_URL, apiKey: "sk-ant-sdk-test", maxRetries: 0, timeout });

// The error object an SDK error carries, whichever shape: openai keeps `error.error`'s inner
// object, anthropic the whole body.
function errorCode(err) {
  const e = err?.error;
  return e?.error?.code ?? e?.code ?? null;
}

// The message of that error object: what a client that drops the code (LiteLLM) shows.
function errorMessage(err) {
  const e = err?.error;
  return e?.error?.message ?? e?.message ?? null;
}

function describe(err) {
  return `${err?.constructor?.name}: ${err?.message} (status ${err?.status}, error ${JSON.stringify(err?.error)})`;
}

async function openaiTokens(stream) {
  const got = [];
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      if (choice.delta?.content) got.push(choice.delta.content);
    }
  }
  return got;
}

async function checkOpenaiStreamAndPlain() {
  const client = openai();
  const stream = await client.chat.completions.create({
    model: "gpt-test",
    messages: MESSAGES,
    stream: true,
  }, { headers: { "x-fake-chunks": "5" } });
  const got = await openaiTokens(stream);
  expect(JSON.stringify(got) === JSON.stringify(TOKENS), `stream tokens ${JSON.stringify(got)}`);
  const plain = await client.chat.completions.create(
    { model: "gpt-test", messages: MESSAGES },
    { headers: { "x-fake-chunks": "5" } },
  );
  expect(plain.choices[0].message.content === TOKENS.join(""), `plain ${JSON.stringify(plain)}`);
  return `${got.length} streamed tokens; plain answer ${JSON.stringify(plain.choices[0].message.content)}`;
}

async function checkAnthropicStreamAndPlain() {
  const client = anthropic();
  const stream = await client.messages.create(
    { model: "claude-test", max_tokens: 64, messages: MESSAGES, stream: true },
    { headers: { "x-fake-chunks": "5" } },
  );
  const got = [];
  for await (const event of stream) {
    if (event.type === "content_block_delta" && event.delta.type === "text_delta") got.push(event.delta.text);
  }
  expect(JSON.stringify(got) === JSON.stringify(TOKENS), `stream deltas ${JSON.stringify(got)}`);
  const plain = await client.messages.create(
    { model: "claude-test", max_tokens: 64, messages: MESSAGES },
    { headers: { "x-fake-chunks": "5" } },
  );
  const text = plain.content.map((b) => b.text).join("");
  expect(text === TOKENS.join(""), `plain ${JSON.stringify(plain)}`);
  return `${got.length} streamed deltas; plain answer ${JSON.stringify(text)}`;
}

// Reads a stream until it throws; returns the tokens seen, when the last came and the error.
async function readUntilError(stream, tokenOf) {
  const got = [];
  let lastAt = null;
  try {
    for await (const item of stream) {
      const t = tokenOf(item);
      if (t) {
        got.push(t);
        lastAt = now();
      }
    }
  } catch (err) {
    return { got, lastAt, err, failedAt: now() };
  }
  throw new CheckFailed(`the stream ended without an error after ${JSON.stringify(got)}`);
}

function expectIdleError({ got, lastAt, err, failedAt }, ErrorClass) {
  expect(err instanceof ErrorClass, `unexpected ${describe(err)}`);
  expect(JSON.stringify(got) === JSON.stringify(TOKENS.slice(0, 2)), `tokens before the error ${JSON.stringify(got)}`);
  expect(errorCode(err) === "idle_timeout", `error code: ${describe(err)}`);
  expect(String(errorMessage(err)).startsWith("idle timeout: "), `message names no limit: ${describe(err)}`);
  const gap = failedAt - lastAt;
  expect(gap >= 1.5 && gap <= 2.5, `error ${gap.toFixed(3)} s after the last token, expected 1.5-2.5 s`);
  return `${err.constructor.name} ${gap.toFixed(3)} s after token 2 (code ${errorCode(err)})`;
}

async function checkOpenaiIdleTimeout() {
  // The route's own idle limit (2 s on model "quick"), raised by the SDK as an APIError.
  const client = openai();
  const stream = await client.chat.completions.create(
    { model: "quick", messages: MESSAGES, stream: true },
    { timeout: IMPATIENT_MS, headers: { "x-fake-chunks": "5", "x-fake-freeze-after": "2" } },
  );
  const seen = await readUntilError(stream, (c) => c.choices[0]?.delta?.content);
  return expectIdleError(seen, OpenAI.APIError);
}

// Reads a whole stream whose tokens come 2.3 s apart, longer than the client's 2 s timeout,
// which ended with the head: Hourglass must not cut what the SDK itself would finish (it
// did, at 1.8 s, when it took X-Stainless-Timeout for a read timeout).
async function readSlowStream(stream, tokenOf) {
  const started = now();
  const got = [];
  for await (const item of stream) {
    const t = tokenOf(item);
    if (t) got.push(t);
  }
  const took = now() - started;
  expect(JSON.stringify(got) === JSON.stringify(TOKENS.slice(0, 3)), `tokens ${JSON.stringify(got)}`);
  expect(took >= 4.5, `the stream took ${took.toFixed(3)} s, expected its gaps of 2.3 s`);
  return `3 tokens 2.3 s apart in ${took.toFixed(3)} s under a 2 s timeout`;
}

const SLOW = { "x-fake-chunks": "3", "x-fake-interval-ms": "2300" };

async function checkAnthropicTimeoutEndsWithTheHead() {
  const client = anthropic(IMPATIENT_MS);
  const stream = await client.messages.create(
    { model: "claude-test", max_tokens: 64, messages: MESSAGES, stream: true },
    { headers: SLOW },
  );
  return readSlowStream(stream, (e) =>
    e.type === "content_block_delta" && e.delta.type === "text_delta" ? e.delta.text : null,
  );
}

// The Responses API (what the OpenAI Agents SDK calls): typed response.* events, the text's
// deltas tok1..tok5, response.completed with usage; not streamed, the SDK's output_text.
async function checkOpenaiResponsesStreamAndPlain() {
  const client = openai();
  const headers = { "x-fake-chunks": "5" };
  const stream = await client.responses.create({ model: "demo", input: "hi", stream: true }, { headers });
  const types = [];
  const got = [];
  let completed = null;
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === "response.output_text.delta") got.push(event.delta);
    if (event.type === "response.completed") completed = event.response;
  }
  expect(JSON.stringify(got) === JSON.stringify(TOKENS), `stream deltas ${JSON.stringify(got)}`);
  expect(types[0] === "response.created" && types.at(-1) === "response.completed", `types ${types}`);
  expect(completed?.usage?.output_tokens === 5, `usage ${JSON.stringify(completed?.usage)}`);
  const plain = await client.responses.create({ model: "demo", input: "hi" }, { headers });
  expect(plain.status === "completed" && plain.output_text === TOKENS.join(""), `plain ${JSON.stringify(plain)}`);
  return `${types.length} events, ${got.length} deltas; plain output_text ${JSON.stringify(plain.output_text)}`;
}

async function checkOpenaiResponsesTimeoutEndsWithTheHead() {
  const client = openai();
  const stream = await client.responses.create(
    { model: "demo", input: "hi", stream: true },
    { timeout: IMPATIENT_MS, headers: SLOW },
  );
  return readSlowStream(stream, (e) => (e.type === "response.output_text.delta" ? e.delta : null));
}

async function checkFirstTokenTimeoutBeforeHead() {
  const client = openai();
  const started = now();
  try {
    const stream = await client.chat.completions.create(
      { model: "gpt-test", messages: MESSAGES, stream: true },
      { headers: { "x-fake-ttft-ms": "10000" } },
    );
    const got = await openaiTokens(stream);
    throw new CheckFailed(`no error; the stream gave ${JSON.stringify(got)}`);
  } catch (err) {
    if (err instanceof CheckFailed) throw err;
    const took = now() - started;
    expect(err instanceof OpenAI.APIError && err.status === 504, `unexpected ${describe(err)}`);
    expect(errorCode(err) === "first_token_timeout", `error code: ${describe(err)}`);
    expect(
      took >= FIRST_TOKEN_TIMEOUT - 0.3 && took <= FIRST_TOKEN_TIMEOUT + 1.0,
      `error after ${took.toFixed(3)} s, expected ~${FIRST_TOKEN_TIMEOUT} s`,
    );
    return `${err.constructor.name} ${err.status} code ${errorCode(err)} after ${took.toFixed(3)} s`;
  }
}

async function checkInvalidBudgetHeader() {
  const client = openai();
  try {
    await client.chat.completions.create(
      { model: "gpt-test", messages: MESSAGES },
      { headers: { "x-request-budget-ms": "abc" } },
    );
  } catch (err) {
    expect(err instanceof OpenAI.BadRequestError, `unexpected ${describe(err)}`);
    expect(err.code === "invalid_budget", `err.code ${err.code}`);
    return `${err.constructor.name} ${err.status} code ${err.code} message ${JSON.stringify(err.error?.message)}`;
  }
  throw new CheckFailed("the request succeeded");
}

async function metricSamples() {
  const text = await (await fetch(`${ADMIN_URL}/metrics`)).text();
  const samples = new Map();
  for (const line of text.split("\n")) {
    if (line && !line.startsWith("#")) {
      const at = line.lastIndexOf(" ");
      samples.set(line.slice(0, at), Number(line.slice(at + 1)));
    }
  }
  return samples;
}

const sample = (s, name, labels) => s.get(`${name}{${labels}}`) ?? 0;

// Waits (up to 5 s) until `ready(samples)` holds: the gateway reports a request when it drops
// the response body, a moment after the client saw the end.
async function settledMetrics(ready) {
  const deadline = now() + 5;
  for (;;) {
    const s = await metricSamples();
    if (ready(s) || now() > deadline) return s;
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function checkBreakCancelsUpstream() {
  const clientOrigin = (s) => sample(s, "hourglass_cancellations_total", 'origin="client",route="chat"');
  const inFlight = (s) => sample(s, "hourglass_upstream_requests_in_flight", 'upstream="fake"');
  const before = clientOrigin(await metricSamples());
  const client = openai();
  const stream = await client.chat.completions.create(
    { model: "gpt-test", messages: MESSAGES, stream: true },
    // 600 tokens, one every 50 ms: 30 s of generation the client abandons after two.
    { headers: { "x-fake-chunks": "600", "x-fake-interval-ms": "50" } },
  );
  const got = [];
  const left = now();
  for await (const chunk of stream) {
    if (chunk.choices[0]?.delta?.content) got.push(chunk.choices[0].delta.content);
    if (got.length === 2) break;
  }
  const s = await settledMetrics((m) => clientOrigin(m) > before && inFlight(m) === 0);
  const took = now() - left;
  expect(clientOrigin(s) === before + 1, `client cancellations ${before} -> ${clientOrigin(s)}`);
  expect(inFlight(s) === 0, `upstream requests still in flight: ${inFlight(s)}`);
  return `break after ${got.length} tokens: counted origin="client", nothing in flight, after ${took.toFixed(3)} s`;
}

async function checkMetrics() {
  const idle = (s, route) => sample(s, "hourglass_cancellations_total", `origin="idle",route="${route}"`);
  const first = (s) => sample(s, "hourglass_cancellations_total", 'origin="first_token",route="chat"');
  // Counted from where this script started: the Python checks may have run first.
  const grown = (m) => ({
    quick: idle(m, "chat-quick") - idle(START, "chat-quick"),
    messages: idle(m, "messages") - idle(START, "messages"),
    responses: idle(m, "responses") - idle(START, "responses"),
    first: first(m) - first(START),
  });
  const s = await settledMetrics((m) => grown(m).quick >= 1 && grown(m).first >= 1);
  const g = grown(s);
  const summary = `since the start: idle chat-quick +${g.quick}, idle messages +${g.messages}, idle responses +${g.responses}, first_token chat +${g.first}`;
  // The slow streams under a 2 s client timeout were not cut.
  expect(g.quick === 1 && g.messages === 0 && g.responses === 0, `idle cancellations: ${summary}`);
  expect(g.first === 1, `first_token cancellations: ${summary}`);
  return summary;
}

// A non-streaming chat call on the stream_upstream route (model "watched") and the same call
// straight to the fake, with a fixed x-fake-id: the same completion, value for value (text, a
// tool call, reasoning_content).
async function checkOpenaiChatStreamUpstreamEqualsDirect() {
  const clients = { gateway: openai(), fake: openai(PATIENT_MS, FAKE_URL) };
  const same = { "x-fake-id": "node1", "x-fake-chunks": "3" };
  const cases = [
    ["text", {}],
    ["tool call", { "x-fake-tool-call": "get_weather", "x-fake-tool-args": '{"city":"Paris"}' }],
    ["reasoning", { "x-fake-reasoning": "2" }],
  ];
  const done = [];
  for (const [what, headers] of cases) {
    const ask = (c) =>
      clients[c].chat.completions.create(
        { model: "watched", messages: MESSAGES },
        { headers: { ...same, ...headers } },
      );
    // Through JSON: only the answer's own fields, not what the SDK attaches (`_request_id`).
    const plain = (v) => {
      const copy = JSON.parse(JSON.stringify(v));
      delete copy._request_id;
      return copy;
    };
    const through = plain(await ask("gateway"));
    const direct = plain(await ask("fake"));
    expect(
      isDeepStrictEqual(through, direct),
      `${what}: through the gateway ${JSON.stringify(through)}, direct ${JSON.stringify(direct)}`,
    );
    const message = through.choices[0].message;
    if (what === "text") expect(message.content === "tok1 tok2 tok3 ", `content ${message.content}`);
    if (what === "tool call")
      expect(message.tool_calls[0].function.arguments === '{"city":"Paris"}', JSON.stringify(message));
    if (what === "reasoning")
      expect(message.reasoning_content === "think1 think2 ", JSON.stringify(message));
    done.push(what);
  }
  return `equal: ${done.join(", ")}`;
}

const CHECKS = [
  checkOpenaiStreamAndPlain,
  checkAnthropicStreamAndPlain,
  checkOpenaiIdleTimeout,
  checkAnthropicTimeoutEndsWithTheHead,
  checkOpenaiResponsesStreamAndPlain,
  checkOpenaiResponsesTimeoutEndsWithTheHead,
  checkFirstTokenTimeoutBeforeHead,
  checkInvalidBudgetHeader,
  checkBreakCancelsUpstream,
  checkOpenaiChatStreamUpstreamEqualsDirect,
  checkMetrics,
];

// Read from disk: the packages' `exports` maps do not export their package.json.
const version = (name) =>
  JSON.parse(readFileSync(`${process.env.HOURGLASS_SDK_NODE_MODULES}/${name}/package.json`, "utf8")).version;
console.log(
  `sdk: node ${process.versions.node}, openai ${version("openai")}, ` +
    `@anthropic-ai/sdk ${version("@anthropic-ai/sdk")}, gateway ${BASE_URL}`,
);
const START = await metricSamples();
let passed = 0;
let failed = 0;
for (const check of CHECKS) {
  const started = now();
  try {
    const detail = await check();
    passed += 1;
    console.log(`PASS node ${check.name} (${(now() - started).toFixed(2)} s): ${detail}`);
  } catch (err) {
    failed += 1;
    const what = err instanceof CheckFailed ? err.message : `${describe(err)}\n${err?.stack}`;
    console.log(`FAIL node ${check.name} (${(now() - started).toFixed(2)} s): ${what}`);
  }
}
if (RESULT_FILE) writeFileSync(RESULT_FILE, `${passed} ${failed}\n`);
else console.log(`sdk node: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
