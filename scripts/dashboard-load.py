#!/usr/bin/env python3
"""Varied traffic through a gateway running config/demo.toml's routes in front of the fake
provider, for scripts/dashboard-png.sh (standard library only; loopback only).

    dashboard-load.py GATEWAY_HOST:PORT SECONDS PHASES_JSON_OUT

Three phases: a healthy third, an incident third (the provider is slow to its first token and
some streams freeze, clients with tight budgets hit their deadlines), and a recovery third.
Throughout: good streams on the chat, reasoning and messages routes, model listings, clients
that hang up mid-stream, malformed and too-small budgets. Workers are bounded in number, each
request in time (30 s socket timeout), the whole run in SECONDS. Writes the phases' wall-clock
bounds to PHASES_JSON_OUT and prints a tally of what it sent.
"""

import collections
import http.client
import json
import random
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


class Load:
    def __init__(self, gw, seconds):
        self.gw = gw
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


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    gw, seconds, phases_out = argv[1], float(argv[2]), argv[3]
    load = Load(gw, seconds)
    threads = [threading.Thread(target=load.worker, args=(i,), daemon=True) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, load.end - time.time()) + 40)
    with open(phases_out, "w") as f:
        json.dump(
            {"start": load.start, "stop": load.end, "end": time.time(), "incident": list(load.incident)}, f
        )
    print("load: " + ", ".join(f"{k} {v}" for k, v in sorted(load.tally.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
