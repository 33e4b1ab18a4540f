#!/usr/bin/env python3
"""The Grafana dashboard's PromQL, run against a real Prometheus (standard library only).

    dashboard-queries.py list  [DASHBOARD]
    dashboard-queries.py check PROM_HOST:PORT METRICS_FILE [DASHBOARD]

`check` runs every panel query of docker/grafana/dashboards/hourglass.json as an instant query,
with the dashboard's variables set to "All" and $__rate_interval to 30s. Every query must be
valid PromQL (the API answers "success"), read only metrics that appear in METRICS_FILE (a
scrape of /metrics of a gateway whose routes use every feature the dashboard shows: every
series exists at zero from start-up, so a missing one is a dashboard that names a metric this
Hourglass does not have) and return at least one series, unless it filters with `> 0`. Prints
one line per query, then `dashboard queries: N ok, M failed`.
"""

import json
import re
import sys
import urllib.parse
import urllib.request
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent / "docker/grafana/dashboards/hourglass.json"
VARS = {"$__rate_interval": "30s", "$route": ".*", "$upstream": ".*"}


def panel_queries(path):
    """(panel title, refId, expr with variables substituted) for every query of every panel."""
    dash = json.loads(Path(path).read_text())
    out = []
    for panel in dash["panels"]:
        for sub in [panel] + panel.get("panels", []):
            for t in sub.get("targets", []):
                expr = t["expr"]
                for k, v in VARS.items():
                    expr = expr.replace(k, v)
                out.append((sub["title"], t["refId"], expr))
    return out


def metric_names(expr):
    """The hourglass_* series names an expression reads (histogram suffixes folded)."""
    names = set(re.findall(r"\bhourglass_[a-z0-9_]+", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def exported(metrics_text):
    return set(re.findall(r"^# TYPE (\S+) ", metrics_text, re.M))


def query(prom, expr):
    data = urllib.parse.urlencode({"query": expr}).encode()
    req = urllib.request.Request(f"http://{prom}/api/v1/query", data=data)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:  # 400 with a JSON error body for bad PromQL
        return json.load(e)


def check(prom, metrics_file, dashboard):
    have = exported(Path(metrics_file).read_text())
    passed = failed = 0
    for title, ref, expr in panel_queries(dashboard):
        answer = query(prom, expr)
        missing = sorted(metric_names(expr) - have)
        label = f"{title} [{ref}]"
        if answer.get("status") != "success":
            ok, why = False, f"Prometheus refused it: {answer.get('error')}"
        elif missing:
            ok, why = False, f"reads {', '.join(missing)}, which the scrape does not have"
        elif re.search(r">\s*0\s*$", expr):
            ok, why = True, f"valid, {len(answer['data']['result'])} series (filtered by > 0)"
        else:
            n = len(answer["data"]["result"])
            ok, why = n > 0, f"{n} series" if n else "no series although its metrics are exported"
        passed += ok
        failed += not ok
        print(f"{'ok' if ok else 'FAILED'}: dashboard query {label}: {why}")
        if not ok:
            print(f"    {expr}")
    print(f"dashboard queries: {passed} ok, {failed} failed")
    return failed == 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "list":
        for title, ref, expr in panel_queries(argv[2] if len(argv) > 2 else DEFAULT):
            print(f"{title} [{ref}]\t{expr}")
        return 0
    if len(argv) >= 4 and argv[1] == "check":
        return 0 if check(argv[2], argv[3], argv[4] if len(argv) > 4 else DEFAULT) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
