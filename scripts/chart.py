#!/usr/bin/env python3
"""Draws docs/performance-memory.png from the numbers scripts/bench.py measured:
memory per identity (window 60 s, filled to its limit) against the limit,
log-log, for the article's script, XCLOAK.ALLOW on a sorted set, XCLOAK.ALLOW
compact and redis-cell. Run by `make bench` with a pinned matplotlib.

Usage: chart.py DATA.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

SERIES = [
    # layout, label, colour, marker
    ("script", "article's Lua script (sorted set + :seq key)", "#d62728", "s"),
    ("zset", "xcloak, sorted-set form", "#ff7f0e", "o"),
    ("compact", "xcloak, compact form (xcloaklog)", "#1f77b4", "D"),
    ("cell", "redis-cell CL.THROTTLE (GCRA, approximate)", "#7f7f7f", "^"),
]


def human(value):
    if value >= 1e6:
        return "%.1f MB" % (value / 1e6)
    if value >= 10_000:
        return "%.0f kB" % (value / 1e3)
    if value >= 1_000:
        return "%.1f kB" % (value / 1e3)
    return "%.0f B" % value


def main():
    data = json.load(open(sys.argv[1]))
    rows = data["rows"]
    limits = [row[0] for row in rows]
    fig, ax = plt.subplots(figsize=(8, 5.2), dpi=110)
    for layout, label, colour, marker in SERIES:
        values = [row[1][layout] for row in rows]
        ax.plot(limits, values, marker=marker, color=colour, label=label, linewidth=2, markersize=6)
        # Labels placed so that close lines don't collide: the script's above-left,
        # the compact form's below-left, the others below-right.
        offset, align = {"script": ((-7, 6), "right"), "compact": ((-7, -13), "right")}.get(layout, ((7, -12), "left"))
        for x, y in zip(limits, values):
            # The sorted set's first label goes above, clear of the compact target's mark.
            at = (7, 3) if layout == "zset" and x == limits[0] else offset
            ax.annotate(human(y), (x, y), textcoords="offset points", xytext=at, ha=align,
                        fontsize=8, color=colour)
    targets = data.get("targets") or {}
    if targets:
        xs = sorted(int(limit) for limit in targets)
        ax.plot(xs, [targets[str(x)] for x in xs], linestyle="none", marker="_", markersize=12,
                markeredgewidth=2, color="#1f77b4", alpha=0.6, label="target for the compact form (at most)")
    # One byte and 100 bytes per request, for scale.
    for per_request, style in ((1, ":"), (100, "--")):
        ax.plot(limits, [per_request * limit for limit in limits], style, color="#bbbbbb", linewidth=1,
                label="%d B per request" % per_request)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(limits[0] / 2.2, limits[-1] * 1.6)
    ax.set_xticks(limits)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: "{:,.0f}".format(v)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human(v)))
    ax.set_xlabel("limit (requests per 60 s window), window filled to the limit")
    ax.set_ylabel("memory per identity (MEMORY USAGE)")
    ax.set_title("Memory per rate-limited identity, exact sliding log vs approximations", fontsize=11)
    ax.grid(True, which="major", color="#e5e5e5")
    ax.legend(fontsize=8, loc="upper left", framealpha=0.95)
    fig.text(0.99, 0.01, "make bench, %s, xcloak %s, %s" % (data["server"], data["commit"], data["date"]),
             ha="right", fontsize=7, color="#777777")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(sys.argv[2])


if __name__ == "__main__":
    main()
