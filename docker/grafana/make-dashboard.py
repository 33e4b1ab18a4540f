#!/usr/bin/env python3
"""Writes docker/grafana/dashboards/hourglass.json, the Grafana dashboard of docker/compose.yaml.

The JSON is this script's output: change the panels here and run it again
(`python3 docker/grafana/make-dashboard.py`); scripts/deploy-check.sh fails when the two differ.
`--check` only compares. Standard library only.

Panels use the `${datasource}`, `$route` and `$upstream` variables and `$__rate_interval`, so the
dashboard also works on another Prometheus; scripts/prometheus-check.sh runs every query against
a real one, and scripts/dashboard-png.sh draws them for docs/dashboard.png.
"""

import json
import re
import sys
from pathlib import Path

DS = {"type": "prometheus", "uid": "${datasource}"}
R = 'route=~"$route"'
# For the series that have an upstream label too: `$upstream` narrows them as well.
RU = R + ',upstream=~"$upstream"'
RI = "$__rate_interval"
panels = []
pid = [0]


def nid():
    """The next panel id."""
    pid[0] += 1
    return pid[0]


def target(expr, legend, ref, **kw):
    """One PromQL query of a panel."""
    t = {
        "datasource": DS,
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
        "range": True,
        "editorMode": "code",
    }
    t.update(kw)
    return t


def row(title, y):
    """A row header spanning the grid at height y."""
    panels.append(
        {
            "type": "row",
            "title": title,
            "id": nid(),
            "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            "panels": [],
        }
    )


def stat(title, desc, expr, unit, x, y, w=4, h=4, thresholds=None, decimals=None):
    """A single number (the last value) with a sparkline, coloured by thresholds."""
    steps = thresholds or [{"color": "green", "value": None}]
    d = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}, "color": {"mode": "thresholds"}}
    if decimals is not None:
        d["decimals"] = decimals
    panels.append(
        {
            "type": "stat",
            "title": title,
            "description": desc,
            "id": nid(),
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": x, "y": y},
            "fieldConfig": {"defaults": d, "overrides": []},
            "options": {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value",
                "graphMode": "area",
                "justifyMode": "auto",
                "orientation": "auto",
                "textMode": "auto",
                "wideLayout": True,
                "showPercentChange": False,
            },
            "targets": [target(expr, "", "A", instant=False)],
        }
    )


def ts(
    title,
    desc,
    targets,
    unit,
    x,
    y,
    w=8,
    h=8,
    stack=False,
    bars=False,
    overrides=None,
    no_value=None,
    thresholds_line=None,
    min0=True,
    legend_calcs=None,
):
    """A time series panel; no_value is what Grafana shows when the queries return nothing."""
    custom = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1 if bars else 2,
        "fillOpacity": 60 if (stack or bars) else 10,
        "gradientMode": "none",
        "showPoints": "never",
        "spanNulls": False,
        "lineInterpolation": "linear",
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "axisPlacement": "auto",
        "axisSoftMin": 0 if min0 else None,
    }
    if custom["axisSoftMin"] is None:
        del custom["axisSoftMin"]
    steps = [{"color": "green", "value": None}]
    if thresholds_line is not None:
        steps.append({"color": "red", "value": thresholds_line})
        custom["thresholdsStyle"] = {"mode": "dashed"}
    d = {
        "unit": unit,
        "custom": custom,
        "color": {"mode": "palette-classic"},
        "thresholds": {"mode": "absolute", "steps": steps},
    }
    if no_value:
        d["noValue"] = no_value
    panels.append(
        {
            "type": "timeseries",
            "title": title,
            "description": desc,
            "id": nid(),
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": x, "y": y},
            "fieldConfig": {"defaults": d, "overrides": overrides or []},
            "options": {
                "legend": {
                    "showLegend": True,
                    "displayMode": "table" if legend_calcs else "list",
                    "placement": "bottom",
                    "calcs": legend_calcs or [],
                },
                "tooltip": {"mode": "multi", "sort": "desc"},
            },
            "targets": targets,
        }
    )


def color(name, c):
    """A fixed colour for the series named `name`."""
    return {
        "matcher": {"id": "byName", "options": name},
        "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": c}}],
    }


# --- at a glance
row("At a glance", 0)
req = f"sum(rate(hourglass_requests_total{{{R}}}[{RI}]))"
stat("Requests / s", "Requests finished per second (all outcomes).", req, "reqps", 0, 1, decimals=1)
stat(
    "Errors",
    'Share of requests with outcome="error": refused by Hourglass (malformed budget, no route, body too large) or the upstream failed. Fail-fast insufficient_budget counts as cancelled.',
    f'sum(rate(hourglass_requests_total{{{R},outcome="error"}}[{RI}])) / clamp_min({req}, 1e-9)',
    "percentunit",
    4,
    1,
    thresholds=[
        {"color": "green", "value": None},
        {"color": "orange", "value": 0.01},
        {"color": "red", "value": 0.05},
    ],
    decimals=1,
)
stat(
    "Cancelled",
    'Share of requests with outcome="cancelled": a limit fired or the client left. The origins are in "Cancellations by origin".',
    f'sum(rate(hourglass_requests_total{{{R},outcome="cancelled"}}[{RI}])) / clamp_min({req}, 1e-9)',
    "percentunit",
    8,
    1,
    thresholds=[
        {"color": "green", "value": None},
        {"color": "orange", "value": 0.05},
        {"color": "red", "value": 0.2},
    ],
    decimals=1,
)
stat(
    "Time to first token p95",
    "95th percentile of head received -> first data event, all selected routes.",
    f"histogram_quantile(0.95, sum by (le) (rate(hourglass_time_to_first_token_seconds_bucket{{{RU}}}[{RI}])))",
    "s",
    12,
    1,
    thresholds=[
        {"color": "green", "value": None},
        {"color": "orange", "value": 2},
        {"color": "red", "value": 10},
    ],
    decimals=2,
)
stat(
    "Budget used p95",
    "95th percentile of elapsed / budget. Near 100%: requests are being cut by their deadline.",
    f"histogram_quantile(0.95, sum by (le) (rate(hourglass_budget_used_ratio_bucket{{{R}}}[{RI}])))",
    "percentunit",
    16,
    1,
    thresholds=[
        {"color": "green", "value": None},
        {"color": "orange", "value": 0.8},
        {"color": "red", "value": 0.95},
    ],
    decimals=0,
)
stat(
    "Upstream in flight",
    "Upstream calls started and not yet finished or cancelled, all selected upstreams.",
    'sum(hourglass_upstream_requests_in_flight{upstream=~"$upstream"})',
    "none",
    20,
    1,
    decimals=0,
)

# --- traffic
row("Traffic and cancellations", 5)
ts(
    "Requests by outcome",
    "hourglass_requests_total by outcome: ok (delivered in full, whatever its status), error (refused or upstream failed), cancelled (a limit fired or the client left), detached (an OpenAI background response whose connection closed: it runs on at the provider).",
    [target(f"sum by (outcome) (rate(hourglass_requests_total{{{R}}}[{RI}]))", "{{outcome}}", "A")],
    "reqps",
    0,
    6,
    stack=True,
    overrides=[
        color("ok", "green"),
        color("error", "red"),
        color("cancelled", "orange"),
        color("detached", "purple"),
    ],
)
ts(
    "Cancellations by origin",
    "hourglass_cancellations_total by origin: client (went away), deadline, first_token, idle, connect, insufficient_budget (failed fast, provider never called), shutdown. Beside them, as 'detached ORIGIN': hourglass_detached_total, OpenAI background responses whose connection closed while they run on at the provider (nothing cancelled).",
    [
        target(f"sum by (origin) (rate(hourglass_cancellations_total{{{R}}}[{RI}])) > 0", "{{origin}}", "A"),
        target(f"sum by (origin) (rate(hourglass_detached_total{{{R}}}[{RI}])) > 0", "detached {{origin}}", "B"),
    ],
    "reqps",
    8,
    6,
    stack=True,
    overrides=[
        color("client", "blue"),
        color("deadline", "red"),
        color("first_token", "purple"),
        color("idle", "orange"),
        color("connect", "dark-red"),
        color("insufficient_budget", "yellow"),
        color("shutdown", "text"),
    ],
)
ts(
    "In flight: upstream calls, client requests, connections",
    "hourglass_upstream_requests_in_flight: calls to each upstream started and not yet finished or cancelled (a cancelled stream leaves it at once). hourglass_requests_in_flight: client requests being served, by route; compare with the route's max_in_flight. hourglass_client_connections: open client connections; compare with max_connections.",
    [
        target(
            'sum by (upstream) (hourglass_upstream_requests_in_flight{upstream=~"$upstream"})',
            "upstream {{upstream}}",
            "A",
        ),
        target(f"sum by (route) (hourglass_requests_in_flight{{{R}}})", "route {{route}}", "B"),
        target("sum(hourglass_client_connections)", "client connections", "C"),
    ],
    "none",
    16,
    6,
)

# --- budget
row("Budget", 14)
ts(
    "Budget margin (completed responses)",
    "hourglass_budget_margin_seconds: budget left when a response completed. The low quantiles are the near misses: when p05 approaches 0, budgets are too tight for the upstream.",
    [
        target(
            f"histogram_quantile({q}, sum by (le) (rate(hourglass_budget_margin_seconds_bucket{{{R}}}[{RI}])))",
            f"p{int(q*100):02d}",
            chr(65 + i),
        )
        for i, q in enumerate([0.05, 0.5, 0.95])
    ],
    "s",
    0,
    15,
)
ts(
    "Budget used ratio",
    "hourglass_budget_used_ratio: elapsed / budget for every request. 1.0 (dashed) means the deadline cut the request.",
    [
        target(
            f"histogram_quantile({q}, sum by (le) (rate(hourglass_budget_used_ratio_bucket{{{R}}}[{RI}])))",
            f"p{int(q*100)}",
            chr(65 + i),
        )
        for i, q in enumerate([0.5, 0.95, 0.99])
    ],
    "percentunit",
    8,
    15,
    thresholds_line=1.0,
)
panels.append(
    {
        "type": "heatmap",
        "title": "Where requests end in their budget",
        "id": nid(),
        "datasource": DS,
        "description": "Requests per bucket of hourglass_budget_used_ratio over time: a band at the top is requests cut by their deadline.",
        "gridPos": {"h": 8, "w": 8, "x": 16, "y": 15},
        "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "exponent": 0.5,
                "fill": "dark-orange",
                "scale": "exponential",
                "steps": 64,
                "reverse": False,
            },
            "yAxis": {"axisPlacement": "left", "unit": "percentunit", "reverse": False},
            "rowsFrame": {"layout": "le"},
            "legend": {"show": True},
            "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False},
            "filterValues": {"le": 1e-9},
            "cellValues": {"unit": "short"},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
        },
        "targets": [
            target(
                f"sum by (le) (increase(hourglass_budget_used_ratio_bucket{{{R}}}[{RI}]))",
                "{{le}}",
                "A",
                format="heatmap",
            )
        ],
    }
)

# --- latency
row("Latency", 23)
ts(
    "Time to first token by route (p50 / p95 / p99)",
    "hourglass_time_to_first_token_seconds: request head received -> first data event (first byte for non-SSE bodies), per route.",
    [
        target(
            f"histogram_quantile({q}, sum by (le, route) (rate(hourglass_time_to_first_token_seconds_bucket{{{RU}}}[{RI}])))",
            f"{{{{route}}}} p{int(q*100)}",
            chr(65 + i),
        )
        for i, q in enumerate([0.5, 0.95, 0.99])
    ],
    "s",
    0,
    24,
    legend_calcs=["mean", "max"],
)
ts(
    "Request duration by route (p50 / p95 / p99)",
    "hourglass_request_duration_seconds: request head received -> response ended, per route.",
    [
        target(
            f"histogram_quantile({q}, sum by (le, route) (rate(hourglass_request_duration_seconds_bucket{{{R}}}[{RI}])))",
            f"{{{{route}}}} p{int(q*100)}",
            chr(65 + i),
        )
        for i, q in enumerate([0.5, 0.95, 0.99])
    ],
    "s",
    8,
    24,
    legend_calcs=["mean", "max"],
)
ts(
    "Upstream answers by status class",
    "hourglass_upstream_responses_total: the head each attempt got, by upstream and status class. A 5xx or 429 passed on to the client is its request's ok outcome, so this is where a failing provider shows.",
    [
        target(
            f'sum by (upstream, class) (rate(hourglass_upstream_responses_total{{{R},upstream=~"$upstream"}}[{RI}]))',
            "{{upstream}} {{class}}",
            "A",
        )
    ],
    "reqps",
    16,
    24,
)

# --- resilience
row("Retries, fallbacks and reloads", 32)
# Every series here exists at zero from start-up (fallbacks for the routes that configure
# them), so these panels show zeros, not "no data", until something happens.
ts(
    "Retries by reason",
    "hourglass_retries_total by reason (connect, first_token, 5xx, 429, reset): extra attempts on the same upstream, on routes with `retries`.",
    [target(f"sum by (reason) (rate(hourglass_retries_total{{{RU}}}[{RI}]))", "{{reason}}", "A")],
    "reqps",
    0,
    33,
    h=7,
    stack=True,
)
ts(
    "Fallbacks, and upstreams passed over",
    "hourglass_fallbacks_total: moves from one upstream to the next in a route's fallback chain, by from -> to, on routes with `fallbacks`. hourglass_upstream_skipped_total: requests that did not try an upstream out of rotation (ejected after eject_after failed attempts in a row) and went straight to a later one; hourglass_upstream_ejected says which upstream is out.",
    [
        target(
            f"sum by (from, to) (rate(hourglass_fallbacks_total{{{R}}}[{RI}]))", "{{from}} \u2192 {{to}}", "A"
        ),
        target(
            f'sum by (upstream) (rate(hourglass_upstream_skipped_total{{{R},upstream=~"$upstream"}}[{RI}]))',
            "{{upstream}} passed over (ejected)",
            "B",
        ),
    ],
    "reqps",
    8,
    33,
    h=7,
    stack=True,
    no_value="No routes with fallbacks",
)
ts(
    "Config reloads",
    "hourglass_config_reloads_total by result (ok, error) per interval. An error keeps the previous config serving; the log names the precise error.",
    [target(f"sum by (result) (increase(hourglass_config_reloads_total[{RI}]))", "{{result}}", "A")],
    "none",
    16,
    33,
    h=7,
    bars=True,
    overrides=[color("ok", "green"), color("error", "red")],
)

row("Runs and clients that do not stream", 40)
# Runs (DESIGN 10): the calls of one agent run share one deadline, a call limit, a token
# budget and a loop stop. The run series of routes with run limits exist at zero from start-up.
ts(
    "Runs ended, by how",
    "hourglass_runs_total by end: expired (ttl after the last call), deadline, calls, tokens, loop (the same tool call run_max_repeats times in a row), evicted (max_runs), lost (a Redis run found gone at a call's end: run Redis with noeviction).",
    [target(f"sum by (end) (increase(hourglass_runs_total{{{R}}}[{RI}]))", "{{end}}", "A")],
    "none",
    0,
    41,
    h=7,
    bars=True,
    overrides=[color("loop", "red"), color("deadline", "orange"), color("calls", "purple")],
)
ts(
    "Calls refused by their run",
    "hourglass_run_refusals_total by reason: calls a run refused (429 run_call_limit, run_token_limit, run_loop_detected; 504 run_deadline_exceeded). None of them reached the provider.",
    [target(f"sum by (reason) (rate(hourglass_run_refusals_total{{{R}}}[{RI}]))", "{{reason}}", "A")],
    "reqps",
    8,
    41,
    h=7,
    stack=True,
)
ts(
    "Runs held, and what a run costs",
    "hourglass_runs_active (runs held by this gateway's memory store), and the p90 of calls and tokens per ended run (hourglass_run_calls, hourglass_run_tokens).",
    [
        target("sum(hourglass_runs_active)", "runs held", "A"),
        target(
            f"histogram_quantile(0.9, sum by (le) (rate(hourglass_run_calls_bucket{{{R}}}[{RI}])))",
            "calls per run (p90)",
            "B",
        ),
    ],
    "none",
    16,
    41,
    h=7,
)
ts(
    "Clients that do not stream",
    "hourglass_stream_upstream_total: non-streaming calls sent upstream as streams (stream_upstream), so the first-token and idle limits watch them; hourglass_partial_answers_total by origin: those cut by a limit after output came, answered with what was generated (partial_answers).",
    [
        target(f"sum(rate(hourglass_stream_upstream_total{{{R}}}[{RI}]))", "streamed upstream", "A"),
        target(
            f"sum by (origin) (rate(hourglass_partial_answers_total{{{R}}}[{RI}]))",
            "partial: {{origin}}",
            "B",
        ),
    ],
    "reqps",
    0,
    48,
    w=12,
    h=7,
)
ts(
    "Run store errors",
    "hourglass_run_store_errors_total by op (admit, finish): calls to a shared run store (Redis) that failed or took longer than store_timeout; the call was served without run limits (on_store_error = allow) or refused 503 (deny).",
    [target("sum by (op) (rate(hourglass_run_store_errors_total[" + RI + "]))", "{{op}}", "A")],
    "reqps",
    12,
    48,
    w=12,
    h=7,
    overrides=[color("admit", "red"), color("finish", "orange")],
)

row("Clients", 55)
# Routes with client keys (security.md): each key's client, by its name in the key file.
ts(
    "Requests by client",
    "hourglass_client_requests_total by client and outcome, on routes with client keys: the client is the name the route's key file gives its key, else the first 16 hex digits of the key's SHA-256.",
    [
        target(
            f"sum by (client, outcome) (rate(hourglass_client_requests_total{{{R}}}[{RI}]))",
            "{{client}} {{outcome}}",
            "A",
        )
    ],
    "reqps",
    0,
    56,
    w=12,
    h=7,
    stack=True,
    no_value="No routes with client keys",
)
ts(
    "Tokens by client",
    "hourglass_client_tokens_total by client and kind: what each client's requests used (reported by the provider, or estimated for a stream cut before its usage came), for chargeback.",
    [
        target(
            f"sum by (client, kind) (rate(hourglass_client_tokens_total{{{R}}}[{RI}]))",
            "{{client}} {{kind}}",
            "A",
        )
    ],
    "none",
    12,
    56,
    w=12,
    h=7,
    stack=True,
    no_value="No routes with client keys",
)

dash = {
    "uid": "hourglass",
    "title": "Hourglass",
    "description": "Budgets, time to first token, cancellations and upstream load of the Hourglass LLM gateway.",
    "tags": ["hourglass", "llm", "gateway"],
    "timezone": "browser",
    "editable": True,
    "graphTooltip": 1,
    "refresh": "10s",
    "schemaVersion": 39,
    "version": 1,
    "time": {"from": "now-30m", "to": "now"},
    "timepicker": {"refresh_intervals": ["5s", "10s", "30s", "1m", "5m"]},
    "annotations": {
        "list": [
            {
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard",
            }
        ]
    },
    "links": [],
    "templating": {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {"selected": True, "text": "Prometheus", "value": "hourglass-prometheus"},
                "hide": 0,
                "refresh": 1,
                "regex": "",
                "includeAll": False,
                "multi": False,
                "options": [],
            },
            {
                "name": "route",
                "label": "Route",
                "type": "query",
                "datasource": DS,
                "definition": "label_values(hourglass_requests_total, route)",
                "query": {
                    "query": "label_values(hourglass_requests_total, route)",
                    "refId": "PrometheusVariableQueryEditor-VariableQuery",
                    "qryType": 1,
                },
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "includeAll": True,
                "allValue": ".*",
                "multi": True,
                "refresh": 2,
                "sort": 1,
                "hide": 0,
                "regex": "",
                "options": [],
            },
            {
                "name": "upstream",
                "label": "Upstream",
                "type": "query",
                "datasource": DS,
                "definition": "label_values(hourglass_upstream_requests_in_flight, upstream)",
                "query": {
                    "query": "label_values(hourglass_upstream_requests_in_flight, upstream)",
                    "refId": "PrometheusVariableQueryEditor-VariableQuery",
                    "qryType": 1,
                },
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "includeAll": True,
                "allValue": ".*",
                "multi": True,
                "refresh": 2,
                "sort": 1,
                "hide": 0,
                "regex": "",
                "options": [],
            },
        ]
    },
    "panels": panels,
}
# `$upstream` narrows every panel whose series have an upstream label (docs/deployment.md):
# the first-token panels filtered by route alone (audit L8).
UPSTREAM_LABELLED = {
    "hourglass_time_to_first_token_seconds", "hourglass_time_to_first_byte_seconds",
    "hourglass_tokens_total", "hourglass_upstream_stream_errors_total",
    "hourglass_upstream_responses_total", "hourglass_upstream_requests_in_flight",
    "hourglass_retries_total", "hourglass_upstream_skipped_total",
}
for p in panels:
    for t in p.get("targets", []):
        for m in re.finditer(r"(hourglass_[a-z_]+?)(?:_bucket|_count|_sum)?\{([^}]*)\}", t["expr"]):
            if m.group(1) in UPSTREAM_LABELLED and 'upstream=~"$upstream"' not in m.group(2):
                sys.exit(f"panel {p['title']!r} reads {m.group(1)} without $upstream: {t['expr']}")
OUT = Path(__file__).resolve().parent / "dashboards" / "hourglass.json"
text = json.dumps(dash, indent=2) + "\n"
if "--check" in sys.argv:
    if OUT.read_text() != text:
        sys.exit(f"{OUT} differs from what {Path(__file__).name} makes: run it, or move your edit into it")
    print(f"{OUT.name} is up to date ({len(panels)} panels)")
else:
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(panels)} panels)")
