#!/usr/bin/env python3
"""Draws the Grafana dashboard (docker/grafana/dashboards/hourglass.json) with matplotlib from a
real Prometheus: every panel at its grid position, with its own queries, units, thresholds and
colours. Run by scripts/dashboard-png.sh, which records the run it draws.

    dashboard-png.py PROM_HOST:PORT PHASES_JSON OUT_PNG [DASHBOARD] [--zero-ok TITLE]...

The run is meant to exercise every panel: one that shows no data, or only zeros, is named and
the exit status is 1 (the picture is written anyway, to look at). `--zero-ok TITLE`: a panel
that this stack cannot make move (the run store's errors, with the memory store) may show zeros,
never no data.
"""

import json
import math
import sys
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

DEFAULT = Path(__file__).resolve().parent.parent / "docker/grafana/dashboards/hourglass.json"
STEP = 2  # seconds between points
RATE = "15s"  # $__rate_interval for a 1 s scrape, smoothed for a picture
HEAT_STEP = 6  # the heatmap's cells: increase over this many seconds each

# Grafana's dark theme and its classic palette.
BG, PANEL, BORDER, TEXT, MUTED, GRID = "#111217", "#181b1f", "#2c3235", "#ccccdc", "#8e8e9a", "#2c3235"
PALETTE = [
    "#73BF69",
    "#F2CC0C",
    "#8AB8FF",
    "#FF780A",
    "#F2495C",
    "#5794F2",
    "#B877D9",
    "#705DA0",
    "#37872D",
    "#FADE2A",
    "#447EBC",
    "#C15C17",
    "#890F02",
    "#0A437C",
]
NAMED = {
    "green": "#73BF69",
    "red": "#F2495C",
    "orange": "#FF9830",
    "blue": "#5794F2",
    "purple": "#B877D9",
    "yellow": "#FADE2A",
    "dark-red": "#C4162A",
    "text": TEXT,
    "dark-orange": "#FA6400",
}


def prom_range(prom, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"http://{prom}/api/v1/query_range?{q}", timeout=30) as r:
        answer = json.load(r)
    if answer["status"] != "success":
        raise RuntimeError(f"{expr}: {answer}")
    return answer["data"]["result"]


def expand(expr, rate=RATE):
    return expr.replace("$__rate_interval", rate).replace("$route", ".*").replace("$upstream", ".*")


def legend(fmt, metric):
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{" + k + "}}", v)
    return out or "value"


def fmt_value(v, unit, decimals=None):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "No data"
    if unit == "percentunit":
        return f"{v * 100:.{1 if decimals is None else decimals}f}%"
    if unit == "s":
        if abs(v) < 1:
            return f"{v * 1000:.0f} ms"
        return f"{v:.{2 if decimals is None else decimals}f} s"
    if unit == "reqps":
        return f"{v:.{1 if decimals is None else decimals}f} req/s"
    return f"{v:.{0 if decimals is None else decimals}f}"


def axis_formatter(unit):
    def f(v, _pos):
        if unit == "percentunit":
            return f"{v * 100:.0f}%"
        if unit == "s":
            if v == 0:
                return "0"
            return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:g} s"
        if unit == "reqps":
            return f"{v:g}/s"
        return f"{v:g}"

    return FuncFormatter(f)


def series_color(panel, name, index):
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        if o["matcher"]["options"] == name:
            for p in o["properties"]:
                if p["id"] == "color":
                    c = p["value"]["fixedColor"]
                    return NAMED.get(c, c)
    return PALETTE[index % len(PALETTE)]


def threshold_color(panel, v):
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    color = steps[0]["color"]
    for s in steps[1:]:
        if v is not None and not math.isnan(v) and v >= s["value"]:
            color = s["color"]
    return NAMED.get(color, color)


def style_axes(ax, unit):
    ax.set_facecolor(PANEL)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.tick_params(colors=MUTED, labelsize=8, length=0, pad=3)
    ax.grid(True, color=GRID, linewidth=0.6)
    ax.yaxis.set_major_formatter(axis_formatter(unit))
    ax.yaxis.set_major_locator(MaxNLocator(4))


def time_axis(ax, start, end):
    """Clock-time ticks every 30 s, none near the edges (the y labels are on the left, and a
    label centred on the right edge would be cut)."""
    first = (int(start + 0.12 * (end - start)) // 30 + 1) * 30
    last = int(end - 0.06 * (end - start))
    ax.set_xticks([datetime.fromtimestamp(t) for t in range(first, last + 1, 30)])
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))


def to_dt(ts):
    return [datetime.fromtimestamp(t) for t in ts]


def shade_incident(ax, phases):
    a, b = phases["incident"]
    ax.axvspan(datetime.fromtimestamp(a), datetime.fromtimestamp(b), color="#F2495C", alpha=0.07, lw=0)


def no_data(ax, panel):
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.55, "No data", color=MUTED, fontsize=13, ha="center", va="center", transform=ax.transAxes)
    note = panel["fieldConfig"]["defaults"].get("noValue", "")
    note = note[len("No data") :].lstrip(":, ") if note.startswith("No data") else note
    if note:
        ax.text(0.5, 0.38, note, color=MUTED, fontsize=9, ha="center", va="center", transform=ax.transAxes)


def draw_timeseries(ax, panel, prom, phases, start, end):
    d = panel["fieldConfig"]["defaults"]
    unit = d.get("unit", "none")
    custom = d.get("custom", {})
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    bars = custom.get("drawStyle") == "bars"
    style_axes(ax, unit)
    lines = []
    ts_grid = list(range(int(start), int(end) + 1, STEP))
    for ti, t in enumerate(panel["targets"]):
        for s in prom_range(prom, expand(t["expr"]), start, end, STEP):
            values = {int(float(x)): float(y) for x, y in s["values"]}
            ys = [values.get(x, float("nan")) for x in ts_grid]
            if all(math.isnan(y) for y in ys):
                continue  # e.g. a quantile of a route that had no requests: nothing to draw
            lines.append((legend(t["legendFormat"], s["metric"]), ys, ti))
    if not lines:
        no_data(ax, panel)
        return False
    xs = to_dt(ts_grid)
    shade_incident(ax, phases)
    if stacked or bars:
        lines.sort(key=lambda l: l[0])
        colors = [series_color(panel, n, i) for i, (n, _, _) in enumerate(lines)]
        filled = [[0.0 if math.isnan(v) else v for v in ys] for _, ys, _ in lines]
        ax.stackplot(xs, *filled, colors=colors, alpha=0.55, labels=[n for n, _, _ in lines], lw=0)
        acc = [0.0] * len(xs)
        for ys, c in zip(filled, colors):
            acc = [a + b for a, b in zip(acc, ys)]
            ax.plot(xs, acc, color=c, lw=1.2)
    else:
        # Quantile panels by route: a colour per route, a line style per quantile (query).
        from matplotlib.lines import Line2D

        styles = ["-", "--", ":"]
        multi_q = len(panel["targets"]) > 1 and any(" p" in n for n, _, _ in lines)
        keys = []
        for name, ys, ti in lines:
            key = name.rsplit(" p", 1)[0] if multi_q else name
            if key not in keys:
                keys.append(key)
            color = series_color(panel, name, keys.index(key))
            ax.plot(
                xs,
                ys,
                color=color,
                lw=1.6,
                ls=styles[ti % 3] if multi_q else "-",
                label=None if multi_q else name,
            )
            if not multi_q and len(lines) <= 3:
                ax.fill_between(xs, ys, color=color, alpha=0.08, lw=0)
        if multi_q:
            handles = [
                Line2D([], [], color=series_color(panel, k, i), lw=2, label=k) for i, k in enumerate(keys)
            ]
            for ti, t in enumerate(panel["targets"]):
                q = t["legendFormat"].rsplit(" ", 1)[-1]
                handles.append(Line2D([], [], color=MUTED, lw=1.4, ls=styles[ti % 3], label=q))
            ax.legend(
                handles=handles,
                loc="upper left",
                fontsize=7.5,
                ncol=len(handles),
                frameon=False,
                labelcolor=TEXT,
                handlelength=2.2,
                columnspacing=1.0,
                borderaxespad=0.2,
            )
    steps = d.get("thresholds", {}).get("steps", [])
    if custom.get("thresholdsStyle", {}).get("mode") == "dashed" and len(steps) > 1:
        ax.axhline(steps[1]["value"], color=NAMED["red"], ls="--", lw=1)
    ax.set_ylim(bottom=0)
    ax.set_xlim(xs[0], xs[-1])
    time_axis(ax, start, end)
    n = len(ax.get_legend_handles_labels()[0])
    if n:
        ax.legend(
            loc="upper left",
            fontsize=7.5,
            ncol=min(n, 4),
            frameon=False,
            labelcolor=TEXT,
            handlelength=1.8,
            columnspacing=1.0,
            borderaxespad=0.2,
        )
    ax.set_ylim(top=ax.get_ylim()[1] * (1.45 if n > 4 else 1.25))  # room for the legend
    return any(y > 0 for _, ys, _ in lines for y in ys if not math.isnan(y))


def draw_stat(ax, panel, prom, phases, start, end):
    d = panel["fieldConfig"]["defaults"]
    t = panel["targets"][0]
    result = prom_range(prom, expand(t["expr"]), start, end, STEP)
    ax.set_facecolor(PANEL)
    ax.set_xticks([])
    ax.set_yticks([])
    for s in ax.spines.values():
        s.set_visible(False)
    if not result:
        ax.text(
            0.5, 0.45, "No data", color=MUTED, fontsize=16, ha="center", va="center", transform=ax.transAxes
        )
        return False
    xs = [float(x) for x, _ in result[0]["values"]]
    ys = [float(y) for _, y in result[0]["values"]]
    last = next((y for y in reversed(ys) if not math.isnan(y)), float("nan"))
    color = threshold_color(panel, last)
    clean = [0.0 if math.isnan(y) else y for y in ys]
    top = max(clean) or 1.0
    ax.fill_between(xs, clean, color=color, alpha=0.18, lw=0)
    ax.plot(xs, clean, color=color, lw=1)
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(0, top * 2.2)
    ax.text(
        0.5,
        0.62,
        fmt_value(last, d.get("unit"), d.get("decimals")),
        color=color,
        fontsize=22,
        fontweight="bold",
        ha="center",
        va="center",
        transform=ax.transAxes,
    )
    return top > 0 and max(clean) > 0


def draw_heatmap(ax, panel, prom, phases, start, end):
    import numpy as np

    t = panel["targets"][0]
    result = prom_range(prom, expand(t["expr"], f"{HEAT_STEP}s"), start, end, HEAT_STEP)
    ax.set_facecolor(PANEL)
    for s in ax.spines.values():
        s.set_visible(False)
    if not result:
        no_data(ax, panel)
        return False
    les = sorted(result, key=lambda s: float(s["metric"]["le"]))
    times = sorted({float(x) for s in les for x, _ in s["values"]})
    grid = np.zeros((len(les), len(times)))
    for i, s in enumerate(les):
        vals = {float(x): float(y) for x, y in s["values"]}
        for j, x in enumerate(times):
            grid[i, j] = vals.get(x, 0.0)
    counts = np.diff(np.vstack([np.zeros(len(times)), grid]), axis=0).clip(min=0)  # de-cumulate
    labels = []
    prev = "0"
    for s in les:
        le = s["metric"]["le"]
        labels.append(f"{float(prev) * 100:.0f}-{float(le) * 100:.0f}%" if le != "+Inf" else ">100%")
        prev = le
    from matplotlib.colors import LinearSegmentedColormap

    cmap = LinearSegmentedColormap.from_list("grafana-oranges", [PANEL, "#8a3b0a", "#FF9830", "#FFE0B2"])
    ax.imshow(
        np.sqrt(counts),
        aspect="auto",
        origin="lower",
        cmap=cmap,
        extent=[
            mdates.date2num(datetime.fromtimestamp(times[0])),
            mdates.date2num(datetime.fromtimestamp(times[-1])),
            0,
            len(les),
        ],
        interpolation="nearest",
    )
    ax.set_yticks([i + 0.5 for i in range(len(les))][::2])
    ax.set_yticklabels(labels[::2])
    ax.tick_params(colors=MUTED, labelsize=7.5, length=0, pad=3)
    ax.xaxis_date()
    time_axis(ax, times[0], times[-1])
    return bool(counts.sum() > 0)


def main(argv):
    zero_ok = set()
    while "--zero-ok" in argv:
        i = argv.index("--zero-ok")
        if i + 1 >= len(argv):
            print(__doc__, file=sys.stderr)
            return 2
        zero_ok.add(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    prom, phases_path, out = argv[1], argv[2], argv[3]
    dash = json.loads(Path(argv[4] if len(argv) > 4 else DEFAULT).read_text())
    phases = json.loads(Path(phases_path).read_text())
    titles = {s["title"] for p in dash["panels"] for s in [p] + p.get("panels", [])}
    if zero_ok - titles:
        print(f"--zero-ok names no panel: {', '.join(sorted(zero_ok - titles))}", file=sys.stderr)
        return 2
    # Up to when the load stopped starting requests: the panels show the traffic, not its tail.
    start, end = math.floor(phases["start"]), math.ceil(phases["stop"])

    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dash["panels"])
    header = 2.6  # grid rows' worth of title block
    unit_w, unit_h = 0.82, 0.34  # inches per grid column / grid row
    fig = plt.figure(figsize=(24 * unit_w, (rows + header) * unit_h), dpi=100, facecolor=BG)
    W, H = 24, rows + header
    pad = 0.12

    def rect(g, title_rows=0.9):
        x0 = (g["x"] + pad) / W
        w = (g["w"] - 2 * pad) / W
        y_top = 1 - (g["y"] + header + pad) / H
        h = (g["h"] - 2 * pad) / H
        return x0, y_top - h, w, h, title_rows / H

    fig.text(0.006, 1 - 0.55 / H, "Hourglass", color=TEXT, fontsize=20, fontweight="bold", va="center")
    mins = (phases["stop"] - phases["start"]) / 60
    fig.text(
        0.006,
        1 - 1.45 / H,
        "The Grafana dashboard docker/grafana/dashboards/hourglass.json, drawn with matplotlib from a real Prometheus "
        f"that scraped Hourglass every second during {mins:.0f} minute{'' if round(mins) == 1 else 's'} of traffic (scripts/dashboard-png.sh): the demo's routes",
        color=MUTED,
        fontsize=10,
        va="center",
    )
    fig.text(
        0.006,
        1 - 2.05 / H,
        "and one with a retry and a fallback, in front of the fake provider; streams, clients hanging up, bad budgets, agent runs their limits stop, clients that do not stream, config reloads (one refused). "
        "Shaded red: an incident third, slow first tokens, frozen streams, the fallback's primary down.",
        color=MUTED,
        fontsize=10,
        va="center",
    )

    drawers = {"timeseries": draw_timeseries, "stat": draw_stat, "heatmap": draw_heatmap}
    empty = []
    for p in dash["panels"]:
        g = p["gridPos"]
        if p["type"] == "row":
            x0, y0, w, h, _ = rect(g)
            fig.text(
                x0,
                y0 + h / 2,
                "\u2304  " + p["title"],
                color=TEXT,
                fontsize=12.5,
                fontweight="bold",
                va="center",
            )
            continue
        x0, y0, w, h, th = rect(g)
        frame = fig.add_axes([x0, y0, w, h])
        frame.set_facecolor(PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for s in frame.spines.values():
            s.set_color(BORDER)
        frame.text(
            0.012,
            1 - (th * 0.5) / h,
            p["title"],
            color=TEXT,
            fontsize=10.5,
            fontweight="bold",
            va="center",
            ha="left",
            transform=frame.transAxes,
        )
        # Room for the y tick labels: about 0.6 inch whatever the panel's width.
        inner_pad_x = 0.012 if p["type"] == "stat" else 0.6 / (g["w"] * unit_w)
        inner_bottom = 0.04 if p["type"] == "stat" else 0.11
        ax = fig.add_axes(
            [
                x0 + w * inner_pad_x,
                y0 + h * inner_bottom,
                w * (1 - inner_pad_x - 0.012),
                h - th - h * (inner_bottom + 0.01),
            ]
        )
        shown = drawers[p["type"]](ax, p, prom, phases, start, end)
        if not shown and not (p["title"] in zero_ok and ax.lines):
            empty.append(p["title"])

    fig.savefig(out, facecolor=BG, dpi=100)
    print(f"wrote {out}")
    if empty:
        print(f"panels with no data or only zeros: {', '.join(empty)}", file=sys.stderr)
        return 1
    total = sum(p["type"] != "row" for p in dash["panels"])
    print(f"every one of the {total} panels shows data" + (f" (zeros allowed: {', '.join(sorted(zero_ok))})" if zero_ok else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
