#!/usr/bin/env python3
"""Plots of a benchmark run (scripts/bench.sh): latency CDFs, cancellation CDFs, memory and
CPU per gateway, as PNGs next to the results JSON.

usage: bench_plot.py RESULTS_JSON OUT_DIR
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "direct": "#555555",
    "hourglass": "#d62728",
    "hourglass-mt": "#ff9896",
    "hourglass-h2": "#ff7f0e",
    "hourglass-h2h2": "#e377c2",
    "nginx": "#2ca02c",
    "haproxy": "#1f77b4",
    "haproxy-h2h2": "#17becf",
    "bare-hyper": "#9467bd",
    "bare-hyper-conn": "#c5b0d5",
    "bare-hyper-h2h2": "#bcbd22",
    "direct-h2": "#999999",
    "litellm": "#ff7f0e",
    "portkey": "#8c564b",
}
# The direct connection and the bare hyper proxies are references, not contenders.
STYLE = {"direct": ":", "direct-h2": ":", "bare-hyper": "--", "bare-hyper-conn": "--", "bare-hyper-h2h2": "--"}


def cdf_lines(ax, per_target, title, xlabel, tail=False):
    """per_target: {name: [[value_ms, quantile], ...]}"""
    for name, points in per_target.items():
        if not points:
            continue
        xs = [max(p[0], 1e-3) for p in points]
        if tail:
            ys = [max(1.0 - p[1], 1e-4) for p in points]
        else:
            ys = [p[1] for p in points]
        ax.plot(xs, ys, label=name, color=COLORS.get(name), linestyle=STYLE.get(name, "-"), linewidth=1.8)
    ax.set_xscale("log")
    if tail:
        ax.set_yscale("log")
        ax.set_ylabel("fraction slower (1 - quantile)")
        ax.set_ylim(1e-4, 1)
    else:
        ax.set_ylabel("quantile")
        ax.set_ylim(0, 1)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def targets_of(scenario, key="targets"):
    return {k: v for k, v in (scenario or {}).get(key, {}).items() if isinstance(v, dict) and "error" not in v}


def main():
    results, out = sys.argv[1], sys.argv[2]
    doc = json.load(open(results))
    sc = doc["scenarios"]
    written = []

    # 1. Latency: per-chunk one-way latency of streams (CDF and tail), non-streaming requests.
    streams = targets_of(sc.get("streams"))
    plain = targets_of(sc.get("nonstream"))
    if streams or plain:
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
        if streams:
            p = sc["streams"]["params"]
            what = f'{p["streams"]} streams x {p["chunks"]} chunks @ {p["interval_ms"]} ms'
            cdf_lines(axes[0], {k: v["cdf"] for k, v in streams.items()},
                      f"per-chunk one-way latency, {what}", "fake wrote the chunk -> client read it (ms)")
            cdf_lines(axes[1], {k: v["cdf"] for k, v in streams.items()},
                      "the same, tail", "ms", tail=True)
        if plain:
            p = sc["nonstream"]["params"]
            cdf_lines(axes[2], {k: v["cdf"] for k, v in plain.items()},
                      f'non-streaming request latency, {p["connections"]} keep-alive connections',
                      "request written -> answer read (ms)")
        fig.tight_layout()
        path = f"{out}/latency_cdf.png"
        fig.savefig(path, dpi=90)
        written.append(path)

    # 2. Client close -> upstream close, per way of leaving.
    leave = (sc.get("leave") or {}).get("kinds", {})
    if leave:
        fig, axes = plt.subplots(1, len(leave), figsize=(5.3 * len(leave), 4.4), squeeze=False)
        for ax, (kind, per) in zip(axes[0], leave.items()):
            ok = {k: v["cdf"] for k, v in per.items() if isinstance(v, dict) and "cdf" in v}
            zombies = {k: v.get("zombies", 0) for k, v in per.items() if isinstance(v, dict)}
            label = kind.replace("_", " ")
            note = ", ".join(f"{k}: {z}" for k, z in zombies.items() if z)
            cdf_lines(ax, ok, f"client leaves {label}" + (f"\nzombies {note}" if note else ""),
                      "client closed -> upstream connection closed (ms)")
        fig.tight_layout()
        path = f"{out}/cancel_cdf.png"
        fig.savefig(path, dpi=90)
        written.append(path)

    # 3. Memory per stream, and 4. CPU, side by side.
    sizes = (sc.get("memory") or {}).get("sizes", {})
    cpu = targets_of(sc.get("cpu"))
    if sizes or cpu or plain:
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
        if sizes:
            ax = axes[0]
            ns = sorted(sizes, key=int)
            names = [t for t in COLORS if any(t in sizes[n] and "rss_per_stream_kib" in sizes[n][t] for n in ns)]
            width = 0.8 / max(len(ns), 1)
            for i, n in enumerate(ns):
                vals = [sizes[n].get(t, {}).get("rss_per_stream_kib", 0) for t in names]
                xs = [j + i * width for j in range(len(names))]
                bars = ax.bar(xs, vals, width, label=f"{n} streams", alpha=0.85 - 0.3 * i,
                              color=[COLORS[t] for t in names])
                ax.bar_label(bars, fmt="%.1f", fontsize=8)
            ax.set_xticks([j + width * (len(ns) - 1) / 2 for j in range(len(names))], names)
            ax.set_ylabel("KiB of gateway RSS per open stream")
            ax.set_title("memory per concurrent slow stream (lighter bar: more streams)", fontsize=10)
            ax.grid(True, axis="y", alpha=0.3)
        if cpu:
            ax = axes[1]
            names = [t for t in COLORS if t in cpu and "gateway_cpu_ms_per_1000_chunks" in cpu[t]]
            vals = [cpu[t]["gateway_cpu_ms_per_1000_chunks"] for t in names]
            bars = ax.bar(names, vals, color=[COLORS[t] for t in names])
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
            p = sc["cpu"]["params"]
            ax.set_title(f'gateway CPU per 1,000 chunks ({p["streams"]} x {p["chunks"]} @ {p["interval_ms"]} ms)', fontsize=10)
            ax.set_ylabel("ms of user+sys CPU")
            ax.grid(True, axis="y", alpha=0.3)
        if plain:
            ax = axes[2]
            names = [t for t in COLORS if t in plain]
            vals = [plain[t]["rps"] for t in names]
            bars = ax.bar(names, vals, color=[COLORS[t] for t in names])
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
            ax.set_title("non-streaming requests/s (direct: no gateway)", fontsize=10)
            ax.grid(True, axis="y", alpha=0.3)
        for ax in axes:
            ax.tick_params(axis="x", labelrotation=25)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
        fig.tight_layout()
        path = f"{out}/memory_cpu.png"
        fig.savefig(path, dpi=90)
        written.append(path)

    for p in written:
        print(f"[bench] plot: {p}")


if __name__ == "__main__":
    main()
