"""A real agent as the client: the OpenAI Agents SDK (`openai-agents`, PyPI) runs its own tool
loop through Hourglass against the fake provider, which asks for the same tool call every
time. Three runs, each stopped by its run's limits, and the framework raising an error that
names why:

  1. run_max_repeats = 3: the fourth call is refused with run_loop_detected, naming the tool;
  2. run_max_calls = 2: the third call is refused with run_call_limit;
  3. run_budget = 2s, every answer taking 700 ms: the run's deadline ends it
     (run_deadline_exceeded), and the last call's budget was shrunk to what the run had left.

Run by tests/sdk/run.sh, which passes HOURGLASS_SDK_BASE_URL, HOURGLASS_SDK_GATEWAY_LOG (the
gateway's log, for the budgets it gave each call) and HOURGLASS_SDK_RESULT.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
import traceback

import openai
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

BASE_URL = os.environ["HOURGLASS_SDK_BASE_URL"].rstrip("/")
GATEWAY_LOG = os.environ["HOURGLASS_SDK_GATEWAY_LOG"]
RESULT_FILE = os.environ.get("HOURGLASS_SDK_RESULT")

set_tracing_disabled(True)
calls_made: dict[str, int] = {}


@function_tool
def get_weather(text: str) -> str:
    """The weather for a place."""
    return "sunny, 24 degrees"


def agent(model: str, run_id: str, extra: dict[str, str] | None = None) -> Agent:
    headers = {"x-run-id": run_id, "x-fake-tool-call": "get_weather", **(extra or {})}
    client = openai.AsyncOpenAI(
        base_url=BASE_URL + "/v1", api_key="sk-agent-test", default_headers=headers
    )
    return Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model, openai_client=client),
    )


async def stopped_by(model: str, run_id: str, extra: dict[str, str] | None = None) -> Exception:
    try:
        result = await Runner.run(agent(model, run_id, extra), "What is the weather in Paris?", max_turns=30)
    except Exception as e:  # the framework's error is what the user sees
        return e
    raise AssertionError(f"the run was not stopped: {result.final_output!r}")


async def run_lines(run_id: str, count: int = 0, code: str | None = None) -> list[str]:
    """The run's request lines, once there are `count` of them and one with `code`, or after
    5 s. A line is written as the request's record is dropped, by the log's own thread, just
    after the client has its answer: the last call's line can trail the SDK's error."""
    deadline = time.monotonic() + 5
    while True:
        with open(GATEWAY_LOG, encoding="utf-8", errors="replace") as f:
            lines = [l for l in f if f'run_id="{run_id}"' in l and "hourglass::request" in l]
        done = len(lines) >= count and (code is None or any(f'code="{code}"' in l for l in lines))
        if done or time.monotonic() > deadline:
            return lines
        await asyncio.sleep(0.02)


async def loop_is_stopped() -> None:
    e = await stopped_by("agent-loop", "agent-loop-1")
    assert isinstance(e, openai.RateLimitError), repr(e)
    message = str(e)
    assert "run loop detected" in message and '"get_weather"' in message and "3 times" in message, message
    assert e.response.headers.get("x-should-retry") == "false"
    lines = await run_lines("agent-loop-1", 4, "run_loop_detected")
    assert len(lines) == 4, lines  # three answered, the fourth refused, none retried


async def calls_are_limited() -> None:
    e = await stopped_by("agent-calls", "agent-calls-1")
    assert isinstance(e, openai.RateLimitError), repr(e)
    assert "run call limit" in str(e) and "2 calls" in str(e), str(e)
    assert len(await run_lines("agent-calls-1", 3, "run_call_limit")) == 3


async def the_deadline_ends_the_run() -> None:
    e = await stopped_by("agent-deadline", "agent-deadline-1", {"x-fake-ttft-ms": "700"})
    assert "run deadline exceeded" in str(e), repr(e)
    # A call the run has too little left for is refused as the run's (run_deadline_exceeded,
    # x-should-retry: false, so the SDK does not retry it). One that arrives once the deadline
    # has passed is refused before the run gives it a budget: its line shows the route's 30 s.
    lines = await run_lines("agent-deadline-1", code="run_deadline_exceeded")
    assert not any('code="insufficient_budget"' in l for l in lines), lines
    assert sum('code="run_deadline_exceeded"' in l for l in lines) == 1, lines  # not retried
    lines = [l for l in lines if not ('code="run_deadline_exceeded"' in l and "budget_ms=30000" in l)]
    budgets = [int(m.group(1)) for l in lines if (m := re.search(r"budget_ms=(\d+)", l))]
    assert budgets and budgets[0] == 2000, budgets  # the first call: the run's whole budget
    # Every later call's budget is what the run had left, not the route's 30 s.
    assert all(b < 2000 for b in budgets[1:]), budgets
    assert budgets[-1] < 1000, budgets


CHECKS = [loop_is_stopped, calls_are_limited, the_deadline_ends_the_run]


def main() -> int:
    import agents

    print(f"agents: openai-agents {agents.__version__ if hasattr(agents, '__version__') else '?'}, openai {openai.__version__}")
    passed = failed = 0
    for check in CHECKS:
        try:
            asyncio.run(check())
            passed += 1
            print(f"agents: ok   {check.__name__}")
        except Exception:
            failed += 1
            print(f"agents: FAIL {check.__name__}")
            traceback.print_exc()
    if RESULT_FILE:
        with open(RESULT_FILE, "w") as f:
            f.write(f"{passed} {failed}\n")
    else:
        print(f"agents: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
