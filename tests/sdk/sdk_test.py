"""End-to-end checks of Hourglass with the official OpenAI and Anthropic Python SDKs as clients.

Run by tests/sdk/run.sh, which starts the fake provider and a gateway and passes:
  HOURGLASS_SDK_BASE_URL   the gateway, e.g. http://127.0.0.1:PORT
  HOURGLASS_SDK_ADMIN_URL  its admin listener (for /metrics)
  HOURGLASS_SDK_FAKE_URL   the fake provider itself, asked directly to compare answers
  HOURGLASS_SDK_RESULT     optional: a file to receive "PASSED FAILED" instead of the summary line

The gateway config run.sh writes: defaults idle_timeout 20s, first_token_timeout 3s, budget 30s;
routes "chat" (/v1/chat/completions), "messages" (/v1/messages) and "responses" (/v1/responses)
on the fake provider; before them, for model "watched", the stream_upstream routes
"chat-watched" (idle_timeout 1s), "messages-watched" and "responses-watched", and for model
"partial" "chat-partial" (stream_upstream with partial_answers).
Every client uses max_retries=0, so an SDK retry never hides a failure or slows the run.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import urllib.request

import anthropic
import openai
from openai.types.responses import Response, ResponseTextDeltaEvent

BASE_URL = os.environ["HOURGLASS_SDK_BASE_URL"].rstrip("/")
ADMIN_URL = os.environ["HOURGLASS_SDK_ADMIN_URL"].rstrip("/")
FAKE_URL = os.environ["HOURGLASS_SDK_FAKE_URL"].rstrip("/")
RESULT_FILE = os.environ.get("HOURGLASS_SDK_RESULT")

CHAT_ROUTE = "chat"
MESSAGES_ROUTE = "messages"
RESPONSES_ROUTE = "responses"
FIRST_TOKEN_TIMEOUT = 3.0  # the route's first_token_timeout in run.sh's config
TOKENS = [f"tok{n} " for n in range(1, 6)]
MESSAGES = [{"role": "user", "content": "hi"}]

# A client that is patient enough for every check that expects an answer. Its read timeout is
# sent as x-stainless-read-timeout (30 s, capped by the gateway to 29 s), well above the route's
# own limits, so those are what the checks see. It also bounds a hang if the gateway misbehaves.
PATIENT = openai.Timeout(30.0)
# The impatient client of the idle checks: 2 s of silence and httpx gives up. Hourglass should
# cap its idle watchdog at 2.0 - min(10%, 1 s) = 1.8 s and answer first.
IMPATIENT = openai.Timeout(60.0, read=2.0)


class CheckFailed(Exception):
    pass


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


def openai_client(timeout=PATIENT, base=BASE_URL) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-sdk-test", max_retries=0, timeout=timeout)


def anthropic_client(timeout=PATIENT, base=BASE_URL) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-sdk-test", max_retries=0, timeout=timeout)


def openai_tokens(chunks) -> list[str]:
    """Content deltas of a chat completion stream, in order (skips the role and finish chunks)."""
    out = []
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                out.append(choice.delta.content)
    return out


def error_code(body) -> str | None:
    """The `code` of an error body as the SDKs hand it over (the error object itself, or the
    whole `{"type":"error","error":{...}}` / `{"error":{...}}` envelope)."""
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            return body["error"].get("code")
        return body.get("code")
    return None


def error_message(body) -> str:
    """The `message` of that error object: what a client that drops the code (LiteLLM) shows."""
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            return str(body["error"].get("message"))
        return str(body.get("message"))
    return ""


def describe(err: BaseException) -> str:
    parts = [f"{type(err).__module__}.{type(err).__name__}: {err}"]
    for attr in ("status_code", "code", "body"):
        if hasattr(err, attr):
            parts.append(f"{attr}={getattr(err, attr)!r}")
    return " ".join(parts)


# ---- checks -----------------------------------------------------------------------------------


def check_openai_stream_and_plain():
    """openai: a stream yields exactly tok1..tok5 in order; a non-stream call returns the text."""
    client = openai_client()
    stream = client.chat.completions.create(
        model="gpt-test", messages=MESSAGES, stream=True, extra_headers={"x-fake-chunks": "5"}
    )
    got = openai_tokens(stream)
    expect(got == TOKENS, f"stream tokens {got!r}, expected {TOKENS!r}")
    plain = client.chat.completions.create(
        model="gpt-test", messages=MESSAGES, extra_headers={"x-fake-chunks": "5"}
    )
    content = plain.choices[0].message.content
    expect(content == "".join(TOKENS), f"non-stream content {content!r}")
    return f"stream {got!r}; non-stream {content!r}"


def check_anthropic_stream_and_plain():
    """anthropic: a stream yields the 5 text deltas; a non-stream call returns the text."""
    client = anthropic_client()
    stream = client.messages.create(
        model="claude-test",
        max_tokens=64,
        messages=MESSAGES,
        stream=True,
        extra_headers={"x-fake-chunks": "5"},
    )
    types, got = [], []
    for event in stream:
        types.append(event.type)
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            got.append(event.delta.text)
    expect(got == TOKENS, f"stream text deltas {got!r}, expected {TOKENS!r}")
    expect(types[0] == "message_start" and types[-1] == "message_stop", f"event types {types!r}")
    # The helper that accumulates a whole message from the stream sees the same text.
    with client.messages.stream(
        model="claude-test", max_tokens=64, messages=MESSAGES, extra_headers={"x-fake-chunks": "5"}
    ) as helper:
        final = helper.get_final_message()
    final_text = "".join(b.text for b in final.content if b.type == "text")
    expect(final_text == "".join(TOKENS), f"messages.stream final text {final_text!r}")
    plain = client.messages.create(
        model="claude-test", max_tokens=64, messages=MESSAGES, extra_headers={"x-fake-chunks": "5"}
    )
    text = "".join(b.text for b in plain.content if b.type == "text")
    expect(text == "".join(TOKENS), f"non-stream text {text!r}")
    return f"stream {got!r}; messages.stream {final_text!r}; non-stream {text!r}"


def check_openai_idle_timeout():
    """openai, 2 s read timeout, upstream freezes after 2 tokens: the SDK raises APIError
    (not APITimeoutError) naming idle_timeout, ~1.8 s after the last token."""
    client = openai_client(IMPATIENT)
    started = time.monotonic()
    stream = client.chat.completions.create(
        model="gpt-test",
        messages=MESSAGES,
        stream=True,
        extra_headers={"x-fake-chunks": "5", "x-fake-freeze-after": "2"},
    )
    got, last_token_at = [], None
    try:
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta and choice.delta.content:
                    got.append(choice.delta.content)
                    last_token_at = time.monotonic()
    except openai.APITimeoutError as err:
        raise CheckFailed(
            f"the SDK timed out blind after {time.monotonic() - started:.3f} s "
            f"(tokens {got!r}): {describe(err)}"
        ) from err
    except openai.APIError as err:
        failed_at = time.monotonic()
        expect(got == TOKENS[:2], f"tokens before the error {got!r}, expected {TOKENS[:2]!r}")
        gap = failed_at - last_token_at
        text = f"{err} {err.body!r}"
        expect("idle_timeout" in text, f"error does not name idle_timeout: {describe(err)}")
        expect(error_code(err.body) == "idle_timeout", f"body code: {describe(err)}")
        expect(err.message.startswith("idle timeout: "), f"message names no limit: {describe(err)}")
        expect(1.5 <= gap <= 2.5, f"error {gap:.3f} s after the last token, expected 1.5-2.5 s")
        return f"{type(err).__name__} {gap:.3f} s after token 2 (code {error_code(err.body)}, message {err.message!r})"
    raise CheckFailed(f"the stream ended without an error after tokens {got!r}")


def check_anthropic_idle_timeout():
    """anthropic, 2 s read timeout, upstream freezes after 2 deltas: the SDK raises
    APIStatusError naming idle_timeout, ~1.8 s after the last delta."""
    client = anthropic_client(IMPATIENT)
    started = time.monotonic()
    stream = client.messages.create(
        model="claude-test",
        max_tokens=64,
        messages=MESSAGES,
        stream=True,
        extra_headers={"x-fake-chunks": "5", "x-fake-freeze-after": "2"},
    )
    got, last_token_at = [], None
    try:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                got.append(event.delta.text)
                last_token_at = time.monotonic()
    except anthropic.APIStatusError as err:
        failed_at = time.monotonic()
        expect(got == TOKENS[:2], f"deltas before the error {got!r}, expected {TOKENS[:2]!r}")
        gap = failed_at - last_token_at
        text = f"{err} {err.body!r}"
        expect("idle_timeout" in text, f"error does not name idle_timeout: {describe(err)}")
        expect(error_code(err.body) == "idle_timeout", f"body code: {describe(err)}")
        expect(
            error_message(err.body).startswith("idle timeout: "), f"message names no limit: {describe(err)}"
        )
        expect(1.5 <= gap <= 2.5, f"error {gap:.3f} s after the last delta, expected 1.5-2.5 s")
        return f"{type(err).__name__} {gap:.3f} s after delta 2 (code {error_code(err.body)})"
    except Exception as err:  # a read timeout surfaces as the transport's own exception here
        raise CheckFailed(
            f"unexpected {describe(err)} after {time.monotonic() - started:.3f} s (deltas {got!r})"
        ) from err
    raise CheckFailed(f"the stream ended without an error after deltas {got!r}")


def check_openai_responses_stream_and_plain():
    """openai Responses API (what the Agents SDK calls): a stream of typed response.* events
    whose output_text deltas are tok1..tok5, ending with response.completed and its usage; the
    responses.stream helper accumulates the same text; not streamed, a Response whose
    output_text is the text."""
    client = openai_client()
    chunks = {"x-fake-chunks": "5"}
    stream = client.responses.create(model="demo", input="hi", stream=True, extra_headers=chunks)
    types, got, completed = [], [], None
    for event in stream:
        types.append(event.type)
        if event.type == "response.output_text.delta":
            expect(isinstance(event, ResponseTextDeltaEvent), f"delta parsed as {type(event)!r}")
            got.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    expect(got == TOKENS, f"stream deltas {got!r}, expected {TOKENS!r}")
    expect(types[0] == "response.created" and types[-1] == "response.completed", f"event types {types!r}")
    expect(completed is not None and completed.output_text == "".join(TOKENS), f"completed {completed!r}")
    expect(completed.usage.output_tokens == 5, f"usage {completed.usage!r}")
    with client.responses.stream(model="demo", input="hi", extra_headers=chunks) as helper:
        final = helper.get_final_response()
    expect(final.output_text == "".join(TOKENS), f"responses.stream final text {final.output_text!r}")
    plain = client.responses.create(model="demo", input="hi", extra_headers=chunks)
    expect(isinstance(plain, Response) and plain.status == "completed", f"non-stream {plain!r}")
    expect(plain.output_text == "".join(TOKENS), f"non-stream output_text {plain.output_text!r}")
    expect(plain.usage.output_tokens == 5, f"non-stream usage {plain.usage!r}")
    return f"{len(types)} events, deltas {got!r}; responses.stream {final.output_text!r}; non-stream {plain.output_text!r}"


def check_openai_responses_function_call():
    """openai Responses API, the provider answering with a tool call (x-fake-tool-call): the
    function-call argument deltas join into JSON, and response.completed carries the call."""
    client = openai_client()
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        "strict": False,
    }
    stream = client.responses.create(
        model="demo",
        input="weather?",
        tools=[tool],
        stream=True,
        extra_headers={"x-fake-chunks": "3", "x-fake-tool-call": "get_weather"},
    )
    pieces, completed = [], None
    for event in stream:
        if event.type == "response.function_call_arguments.delta":
            pieces.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    args = json.loads("".join(pieces))
    expect(args == {"text": "tok1 tok2 tok3 "}, f"arguments {args!r} from {pieces!r}")
    call = completed.output[0]
    expect(call.type == "function_call" and call.name == "get_weather", f"output {completed.output!r}")
    expect(json.loads(call.arguments) == args, f"completed arguments {call.arguments!r}")
    return f"{len(pieces)} argument deltas -> {args!r}, call {call.name} {call.call_id}"


def check_openai_responses_idle_timeout():
    """openai Responses API, 2 s read timeout, upstream freezes after 2 deltas: APIError
    naming idle_timeout, in code and in words, ~1.8 s after the last delta."""
    client = openai_client(IMPATIENT)
    stream = client.responses.create(
        model="demo",
        input="hi",
        stream=True,
        extra_headers={"x-fake-chunks": "5", "x-fake-freeze-after": "2"},
    )
    got, last_token_at = [], None
    try:
        for event in stream:
            if event.type == "response.output_text.delta":
                got.append(event.delta)
                last_token_at = time.monotonic()
    except openai.APITimeoutError as err:
        raise CheckFailed(f"the SDK timed out blind (deltas {got!r}): {describe(err)}") from err
    except openai.APIError as err:
        gap = time.monotonic() - last_token_at
        expect(got == TOKENS[:2], f"deltas before the error {got!r}, expected {TOKENS[:2]!r}")
        expect(error_code(err.body) == "idle_timeout", f"body code: {describe(err)}")
        expect(err.message.startswith("idle timeout: "), f"message names no limit: {describe(err)}")
        expect(1.5 <= gap <= 2.5, f"error {gap:.3f} s after the last delta, expected 1.5-2.5 s")
        return f"{type(err).__name__} {gap:.3f} s after delta 2 (code {error_code(err.body)}, message {err.message!r})"
    raise CheckFailed(f"the stream ended without an error after deltas {got!r}")


def check_first_token_timeout_before_head():
    """openai, upstream silent for 10 s before its head: 504 first_token_timeout after ~3 s."""
    client = openai_client()
    started = time.monotonic()
    try:
        stream = client.chat.completions.create(
            model="gpt-test",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-fake-ttft-ms": "10000"},
        )
        got = openai_tokens(stream)
    except openai.APIStatusError as err:
        took = time.monotonic() - started
        expect(err.status_code == 504, f"status {err.status_code}: {describe(err)}")
        expect(error_code(err.body) == "first_token_timeout", f"body code: {describe(err)}")
        expect(
            FIRST_TOKEN_TIMEOUT - 0.3 <= took <= FIRST_TOKEN_TIMEOUT + 1.0,
            f"error after {took:.3f} s, expected ~{FIRST_TOKEN_TIMEOUT} s",
        )
        return f"{type(err).__name__} {err.status_code} code {error_code(err.body)} after {took:.3f} s"
    except openai.APIError as err:
        raise CheckFailed(f"unexpected {describe(err)}") from err
    raise CheckFailed(f"no error; the stream gave {got!r} after {time.monotonic() - started:.3f} s")


def check_invalid_budget_header():
    """openai, x-request-budget-ms: abc → BadRequestError with code invalid_budget."""
    client = openai_client()
    try:
        client.chat.completions.create(
            model="gpt-test", messages=MESSAGES, extra_headers={"x-request-budget-ms": "abc"}
        )
    except openai.BadRequestError as err:
        expect(error_code(err.body) == "invalid_budget", f"body code: {describe(err)}")
        expect(err.code == "invalid_budget", f"err.code {err.code!r}")
        return f"{type(err).__name__} {err.status_code} code {err.code} message {err.message!r}"
    except openai.APIError as err:
        raise CheckFailed(f"unexpected {describe(err)}") from err
    raise CheckFailed("the request succeeded")


# ---- stream_upstream: a non-streaming call, watched by streaming upstream ---------------------

# A fixed x-fake-id fixes the ids and timestamps, so the gateway's assembled answer and the
# fake's own compare equal, field for field, as the SDK parsed them.
SAME = {"x-fake-id": "sdk1", "x-fake-chunks": "3"}
CALL = {"x-fake-tool-call": "get_weather", "x-fake-tool-args": '{"city":"Paris","days":2}'}
THINK = {"x-fake-reasoning": "2"}


def same_answer(what: str, ask):
    """`ask(client)` through the stream_upstream route and straight to the fake: the same."""
    through = ask("gateway").model_dump()
    direct = ask("fake").model_dump()
    expect(through == direct, f"{what}: through the gateway {through!r}, direct {direct!r}")
    return through


def check_openai_chat_stream_upstream_equals_direct():
    """openai chat.completions.create() without streaming, on a stream_upstream route: the
    answer assembled from the stream is the one the provider gives unstreamed (text, a tool
    call, reasoning_content as an extra field)."""
    clients = {"gateway": openai_client(), "fake": openai_client(base=FAKE_URL)}
    done = []
    for what, headers in [("text", {}), ("tool call", CALL), ("reasoning", THINK)]:
        doc = same_answer(
            what,
            lambda c: clients[c].chat.completions.create(
                model="watched", messages=MESSAGES, extra_headers={**SAME, **headers}
            ),
        )
        message = doc["choices"][0]["message"]
        if what == "text":
            expect(message["content"] == "tok1 tok2 tok3 ", f"content {message!r}")
        elif what == "tool call":
            args = json.loads(message["tool_calls"][0]["function"]["arguments"])
            expect(args == {"city": "Paris", "days": 2}, f"arguments {args!r}")
            expect(doc["choices"][0]["finish_reason"] == "tool_calls", f"finish {doc!r}")
        else:
            expect(message.get("reasoning_content") == "think1 think2 ", f"reasoning {message!r}")
        expect(doc["usage"]["completion_tokens"] > 0, f"usage {doc['usage']!r}")
        done.append(what)
    return f"equal: {', '.join(done)}"


def check_openai_responses_stream_upstream_equals_direct():
    """openai responses.create() without streaming, on a stream_upstream route: the same
    Response as the provider's (text, a function_call, a reasoning item)."""
    clients = {"gateway": openai_client(), "fake": openai_client(base=FAKE_URL)}
    done = []
    for what, headers in [("text", {}), ("function_call", CALL), ("reasoning", THINK)]:
        doc = same_answer(
            what,
            lambda c: clients[c].responses.create(
                model="watched", input="hi", extra_headers={**SAME, **headers}
            ),
        )
        expect(doc["status"] == "completed", f"status {doc['status']!r}")
        kinds = [item["type"] for item in doc["output"]]
        want = {"text": ["message"], "function_call": ["function_call"], "reasoning": ["reasoning", "message"]}
        expect(kinds == want[what], f"{what}: output items {kinds!r}")
        done.append(what)
    return f"equal: {', '.join(done)}"


def check_anthropic_stream_upstream_equals_direct():
    """anthropic messages.create() without streaming, on a stream_upstream route: the same
    Message as the provider's (text, tool_use, thinking with its signature)."""
    clients = {"gateway": anthropic_client(), "fake": anthropic_client(base=FAKE_URL)}
    done = []
    for what, headers in [("text", {}), ("tool_use", CALL), ("thinking", THINK)]:
        doc = same_answer(
            what,
            lambda c: clients[c].messages.create(
                model="watched", max_tokens=64, messages=MESSAGES, extra_headers={**SAME, **headers}
            ),
        )
        first = doc["content"][0]
        if what == "tool_use":
            expect(first["type"] == "tool_use" and first["input"] == {"city": "Paris", "days": 2}, f"{first!r}")
            expect(doc["stop_reason"] == "tool_use", f"stop {doc['stop_reason']!r}")
        elif what == "thinking":
            expect(first["type"] == "thinking" and first["signature"], f"{first!r}")
            expect(first["thinking"] == "think1 think2 ", f"{first!r}")
        else:
            expect(first["type"] == "text" and first["text"] == "tok1 tok2 tok3 ", f"{first!r}")
        done.append(what)
    return f"equal: {', '.join(done)}"


def check_stream_upstream_frozen_fails_with_idle_timeout():
    """openai, non-streaming, upstream frozen after 2 tokens, on a stream_upstream route with a
    1 s idle limit: the call fails with the idle_timeout error (not after the 30 s budget)."""
    client = openai_client()
    try:
        client.chat.completions.create(
            model="watched",
            messages=MESSAGES,
            extra_headers={"x-fake-chunks": "10", "x-fake-freeze-after": "2"},
        )
    except openai.APIStatusError as err:
        expect(err.status_code == 504, f"status {err.status_code}: {describe(err)}")
        expect(error_code(err.body) == "idle_timeout", f"body code: {describe(err)}")
        # (Not err.message: for an error status the SDK prefixes it with "Error code: 504 - ".)
        expect(
            error_message(err.body).startswith("idle timeout: "), f"message names no limit: {describe(err)}"
        )
        return f"{type(err).__name__} {err.status_code} code {error_code(err.body)}"
    raise CheckFailed("the call succeeded")


def check_stream_upstream_partial_answer_at_the_deadline():
    """openai, non-streaming, a 1 s budget on a 10 s generation, partial_answers on: 200 with
    the text so far, finish_reason "length" and x-hourglass-partial: deadline_exceeded."""
    client = openai_client()
    raw = client.chat.completions.with_raw_response.create(
        model="partial",
        messages=MESSAGES,
        extra_headers={"x-request-budget-ms": "1000", "x-fake-chunks": "100", "x-fake-interval-ms": "100"},
    )
    partial = raw.headers.get("x-hourglass-partial")
    expect(partial == "deadline_exceeded", f"x-hourglass-partial {partial!r}")
    done = raw.parse()
    choice = done.choices[0]
    expect(choice.finish_reason == "length", f"finish_reason {choice.finish_reason!r}")
    text = choice.message.content or ""
    expect(text.startswith("tok1 tok2 "), f"content {text!r}")
    expect(done.usage is not None and done.usage.completion_tokens > 0, f"usage {done.usage!r}")
    return f"partial ({partial}): {len(text.split())} tokens, finish_reason {choice.finish_reason}"


def metric_samples() -> dict[str, float]:
    with urllib.request.urlopen(ADMIN_URL + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def check_metrics():
    """/metrics counts the idle cancellations (one per route) and the first-token one."""

    def sample(s, route, origin):
        return s.get(f'hourglass_cancellations_total{{origin="{origin}",route="{route}"}}', 0.0)

    # The gateway reports a request when it drops the response body, a moment after the
    # client saw the end, so give it a little time.
    deadline = time.monotonic() + 5
    while True:
        s = metric_samples()
        idle = {r: sample(s, r, "idle") for r in (CHAT_ROUTE, MESSAGES_ROUTE, RESPONSES_ROUTE)}
        first = sample(s, CHAT_ROUTE, "first_token")
        ok = all(v >= 1 for v in idle.values()) and first >= 1
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    summary = f"idle {idle}, first_token chat {first}"
    expect(all(v >= 1 for v in idle.values()), f"idle per route: {summary}")
    expect(first >= 1, f"first_token cancellations: {summary}")
    return summary


CHECKS = [
    check_openai_stream_and_plain,
    check_anthropic_stream_and_plain,
    check_openai_idle_timeout,
    check_anthropic_idle_timeout,
    check_openai_responses_stream_and_plain,
    check_openai_responses_function_call,
    check_openai_responses_idle_timeout,
    check_first_token_timeout_before_head,
    check_invalid_budget_header,
    check_openai_chat_stream_upstream_equals_direct,
    check_openai_responses_stream_upstream_equals_direct,
    check_anthropic_stream_upstream_equals_direct,
    check_stream_upstream_frozen_fails_with_idle_timeout,
    check_stream_upstream_partial_answer_at_the_deadline,
    check_metrics,
]


def main() -> int:
    print(
        f"sdk: python {sys.version.split()[0]}, openai {openai.__version__}, "
        f"anthropic {anthropic.__version__}, gateway {BASE_URL}"
    )
    passed = failed = 0
    for check in CHECKS:
        started = time.monotonic()
        try:
            detail = check()
        except CheckFailed as err:
            failed += 1
            print(f"FAIL {check.__name__} ({time.monotonic() - started:.2f} s): {err}")
        except Exception as err:  # noqa: BLE001 - any surprise is a failure with its details
            failed += 1
            print(f"FAIL {check.__name__} ({time.monotonic() - started:.2f} s): {describe(err)}")
            traceback.print_exc(file=sys.stdout)
        else:
            passed += 1
            print(f"PASS {check.__name__} ({time.monotonic() - started:.2f} s): {detail}")
    if RESULT_FILE:
        with open(RESULT_FILE, "w") as f:
            f.write(f"{passed} {failed}\n")
    else:
        print(f"sdk: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
