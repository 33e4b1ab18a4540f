#!/usr/bin/env python3
"""Varied traffic through a gateway running config/demo.toml's routes in front of the fake
provider, for scripts/dashboard-png.sh (standard library only; loopback only).

    dashboard-load.py GATEWAY_HOST:PORT SECONDS PHASES_JSON_OUT [--config FILE] [--primary BIN ADDR]

Three phases: a healthy third, an incident third (the provider is slow to its first token and
some streams freeze, clients with tight budgets hit their deadlines), and a recovery third.
Throughout: good streams on the chat, reasoning and messages routes, model listings, clients
that hang up mid-stream, malformed and too-small budgets, clients that do not stream (some cut
by their budget: partial answers), and agent runs on the chat route that the run stops: a loop
(the same tool call again and again) or a run deadline shorter than its calls. Workers are bounded in number, each
request in time (30 s socket timeout), the whole run in SECONDS. Writes the phases' wall-clock
bounds to PHASES_JSON_OUT and prints a tally of what it sent.

--primary: the gateway also has route chat-ha (scripts/hourglass-stack.sh with_fallback_route),
whose upstream "primary" is at ADDR. This script runs the fake provider there (`BIN
fake-upstream`) and stops it for the incident third, so that chat-ha's requests are retried and
fall back to the demo's provider; streams for "ha-demo" go there throughout. It also has route
chat-teams, whose clients need keys: streams for "team-demo" carry one of three (team-a's, and
team-b's two), so the per-client panels have two clients.

--config: the gateway's config file, which it reloads when its contents change. This script
edits it four times: at 1/6 and 5/6 of the run a comment changes (a reload, ok), at 0.45 an
operator's typo (a route naming an upstream that does not exist: the reload fails, the previous
config serves on), fixed at 0.55 (ok).
"""

import argparse
import collections
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time

WORKERS = 12


def chat_body(model="demo", stream=True):
    return json.dumps({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})


def request(gw, method, path, headers, body=None, read_lines=None):
    """Sends one request; reads the whole body, or only `read_lines` lines and then hangs up."""
    host, port = gw.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json", **headers})
        resp = conn.getresponse()
        if read_lines is None:
            data = resp.read()
            return resp.status, data
        for _ in range(read_lines):
            if not resp.readline():
                break
        return resp.status, b""  # closing the connection mid-stream: the client went away
    finally:
        conn.close()


class Primary:
    """The fake provider behind route chat-ha's upstream, started and stopped by this script."""

    def __init__(self, binary, addr):
        self.binary, self.addr, self.proc = binary, addr, None

    def start(self):
        self.proc = subprocess.Popen(
            [self.binary, "fake-upstream", "--listen", self.addr],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        host, port = self.addr.rsplit(":", 1)
        deadline = time.time() + 10
        while time.time() < deadline:  # until it listens
            try:
                http.client.HTTPConnection(host, int(port), timeout=1).request("GET", "/v1/models")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the primary fake provider does not listen on {self.addr}")

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def reload_config(path, edit):
    """Rewrites the gateway's config (atomically: the gateway polls it) with edit(text)."""
    with open(path) as f:
        text = f.read()
    tmp = f"{path}.new"
    with open(tmp, "w") as f:
        f.write(edit(text))
    os.replace(tmp, path)


# The keys scripts/hourglass-stack.sh writes for route chat-teams (team-b has two).
TEAM_KEYS = ["stack-key-team-a-0001", "stack-key-team-b-0001", "stack-key-team-b-0002"]


class Load:
    def __init__(self, gw, seconds, ha=False):
        self.gw = gw
        self.ha = ha
        self.start = time.time()
        self.end = self.start + seconds
        third = seconds / 3
        self.incident = (self.start + third, self.start + 2 * third)
        self.tally = collections.Counter()
        self.lock = threading.Lock()

    def in_incident(self):
        return self.incident[0] <= time.time() < self.incident[1]

    def scenario(self, rng):
        incident = self.in_incident()
        # (weight, name): the mix shifts during the incident.
        mix = [
            (40 if not incident else 22, "chat_stream"),
            (10, "reasoning_stream"),
            (12, "messages_stream"),
            (6, "models"),
            (5, "client_abort"),
            (2, "bad_budget"),
            (2, "tiny_budget"),
            (2 if not incident else 12, "frozen"),
            (1 if not incident else 12, "slow_first_token"),
            (1 if not incident else 10, "tight_budget"),
            (8 if self.ha else 0, "ha_stream"),
            (6 if self.ha else 0, "team_stream"),
            (6, "not_streaming"),
            (1 if not incident else 6, "partial_answer"),
            (3, "agent_loop"),
            (2 if not incident else 5, "agent_out_of_time"),
        ]
        total = sum(w for w, _ in mix)
        pick = rng.uniform(0, total)
        for w, name in mix:
            pick -= w
            if pick <= 0:
                return name
        return mix[0][1]

    def run_one(self, rng):
        name = self.scenario(rng)
        incident = self.in_incident()
        gw = self.gw
        chat = "/v1/chat/completions"
        if name == "chat_stream":
            ttft = rng.randint(800, 3500) if incident else rng.randint(60, 450)
            h = {
                "x-fake-ttft-ms": str(ttft),
                "x-fake-chunks": str(rng.randint(10, 40)),
                "x-fake-interval-ms": str(rng.randint(20, 60)),
            }
            request(gw, "POST", chat, h, chat_body())
        elif name == "reasoning_stream":
            ttft = rng.randint(3000, 9000) if incident else rng.randint(1200, 3500)
            h = {
                "x-fake-ttft-ms": str(ttft),
                "x-fake-chunks": str(rng.randint(20, 50)),
                "x-fake-interval-ms": "30",
            }
            request(gw, "POST", chat, h, chat_body("o3-mini"))
        elif name == "messages_stream":
            ttft = rng.randint(500, 2500) if incident else rng.randint(100, 600)
            h = {
                "x-fake-ttft-ms": str(ttft),
                "x-fake-chunks": str(rng.randint(10, 30)),
                "x-fake-interval-ms": str(rng.randint(20, 50)),
            }
            request(
                gw,
                "POST",
                "/v1/messages",
                h,
                json.dumps(
                    {
                        "model": "claude-demo",
                        "stream": True,
                        "max_tokens": 64,
                        "messages": [{"role": "user", "content": "hi"}],
                    }
                ),
            )
        elif name == "ha_stream":  # route chat-ha: primary, then a fallback when it is down
            h = {
                "x-fake-ttft-ms": str(rng.randint(60, 450)),
                "x-fake-chunks": str(rng.randint(10, 30)),
                "x-fake-interval-ms": str(rng.randint(20, 50)),
            }
            request(gw, "POST", chat, h, chat_body("ha-demo"))
        elif name == "team_stream":  # route chat-teams: clients with keys, named in its file
            key = rng.choice(TEAM_KEYS)
            h = {
                "authorization": f"Bearer {key}",
                "x-fake-ttft-ms": str(rng.randint(60, 450)),
                "x-fake-chunks": str(rng.randint(5, 40) if "team-a" in key else rng.randint(20, 60)),
                "x-fake-interval-ms": "20",
            }
            request(gw, "POST", chat, h, chat_body("team-demo"))
        elif name == "not_streaming":  # route chat streams upstream, answers one document
            h = {"x-fake-ttft-ms": str(rng.randint(60, 450)), "x-fake-chunks": str(rng.randint(5, 30))}
            request(gw, "POST", chat, h, chat_body(stream=False))
        elif name == "partial_answer":  # a non-streaming client whose budget ends mid-answer
            h = {
                "x-request-budget-ms": str(rng.randint(1500, 3000)),
                "x-fake-ttft-ms": str(rng.randint(100, 500)),
                "x-fake-chunks": "200",
                "x-fake-interval-ms": "40",
            }
            request(gw, "POST", chat, h, chat_body(stream=False))
        elif name == "agent_loop":  # the model asks for the same tool call until the run stops it
            run = {"x-run-id": f"dash-loop-{rng.getrandbits(64):016x}", "x-fake-tool-call": "lookup"}
            for _ in range(6):
                h = {**run, "x-fake-ttft-ms": str(rng.randint(60, 300)), "x-fake-chunks": "4"}
                status, _ = request(gw, "POST", chat, h, chat_body())
                if status != 200:
                    break
        elif name == "agent_out_of_time":  # a run with 2-4 s for calls of 0.5-1.5 s each
            run = {
                "x-run-id": f"dash-time-{rng.getrandbits(64):016x}",
                "x-run-budget-ms": str(rng.randint(2000, 4000)),
            }
            for _ in range(10):
                h = {
                    **run,
                    "x-fake-ttft-ms": str(rng.randint(300, 1000)),
                    "x-fake-chunks": "10",
                    "x-fake-interval-ms": "30",
                }
                status, _ = request(gw, "POST", chat, h, chat_body(stream=rng.random() < 0.5))
                if status != 200:
                    break
        elif name == "models":
            request(gw, "GET", "/v1/models", {"x-fake-ttft-ms": str(rng.randint(5, 60))})
        elif name == "client_abort":
            h = {
                "x-fake-ttft-ms": str(rng.randint(50, 300)),
                "x-fake-chunks": "200",
                "x-fake-interval-ms": "40",
            }
            request(gw, "POST", chat, h, chat_body(), read_lines=rng.randint(4, 40))
        elif name == "bad_budget":
            request(gw, "POST", chat, {"x-request-budget-ms": rng.choice(["abc", "0", "-5"])}, "{}")
        elif name == "tiny_budget":
            request(gw, "POST", chat, {"x-request-budget-ms": str(rng.randint(1, 60))}, chat_body())
        elif name == "frozen":
            h = {"x-fake-freeze-after": str(rng.randint(1, 8)), "x-fake-interval-ms": "30"}
            request(gw, "POST", chat, h, chat_body())
        elif name == "slow_first_token":  # beyond the chat route's 5 s first-token limit
            request(gw, "POST", chat, {"x-fake-ttft-ms": str(rng.randint(5500, 8000))}, chat_body())
        elif name == "tight_budget":  # the client's 2-4 s budget is shorter than the stream
            h = {
                "x-request-budget-ms": str(rng.randint(2000, 4000)),
                "x-fake-ttft-ms": str(rng.randint(300, 1500)),
                "x-fake-chunks": "200",
                "x-fake-interval-ms": "40",
            }
            request(gw, "POST", chat, h, chat_body())
        with self.lock:
            self.tally[name] += 1

    def worker(self, seed):
        rng = random.Random(seed)
        while time.time() < self.end:
            try:
                self.run_one(rng)
            except (OSError, http.client.HTTPException) as e:
                with self.lock:
                    self.tally[f"client error: {type(e).__name__}"] += 1
            time.sleep(rng.uniform(0.05, 0.4))


TYPO = '\n[[routes]]\nname = "typo"\npath_prefix = "/v1/typo"\nupstream = "fakee"\n'


def at(when, action):
    """Runs action at wall-clock time `when`, in a thread of its own."""

    def run():
        time.sleep(max(0.0, when - time.time()))
        action()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gw")
    parser.add_argument("seconds", type=float)
    parser.add_argument("phases_out")
    parser.add_argument("--config")
    parser.add_argument("--primary", nargs=2, metavar=("BIN", "ADDR"))
    args = parser.parse_args(argv[1:])
    primary = Primary(*args.primary) if args.primary else None
    if primary:
        primary.start()
    load = Load(args.gw, args.seconds, ha=primary is not None)
    events = []
    try:
        length = load.end - load.start
        if primary:
            events.append(at(load.incident[0], primary.stop))
            events.append(at(load.incident[1], primary.start))
        if args.config:
            mark = lambda n: lambda t: t + f"\n# dashboard-load.py: reload {n}\n"  # noqa: E731
            # A route naming an upstream that does not exist: refused, the old config serves on.
            typo = lambda t: t + TYPO  # noqa: E731
            fix = lambda t: t.replace(TYPO, "\n# dashboard-load.py: typo fixed\n")  # noqa: E731
            for frac, edit in [(1 / 6, mark(1)), (0.45, typo), (0.55, fix), (5 / 6, mark(2))]:
                events.append(at(load.start + frac * length, lambda e=edit: reload_config(args.config, e)))
        threads = [threading.Thread(target=load.worker, args=(i,), daemon=True) for i in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(1.0, load.end - time.time()) + 40)
        for e in events:
            e.join(timeout=10)
    finally:
        if primary:
            primary.stop()
    with open(args.phases_out, "w") as f:
        json.dump(
            {"start": load.start, "stop": load.end, "end": time.time(), "incident": list(load.incident)}, f
        )
    print("load: " + ", ".join(f"{k} {v}" for k, v in sorted(load.tally.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
