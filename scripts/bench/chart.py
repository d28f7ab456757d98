#!/usr/bin/env python3
"""Draws docs/performance-memory.png from the figures `make bench` measured (scripts/bench),
two panels side by side:

- memory per identity (used_memory delta per identity over 10,000 identities,
  window 60 s filled to its limit) against the limit, log-log, for the
  article's script, XCLOAK.ALLOW on a sorted set, XCLOAK.ALLOW compact and
  redis-cell, with the compact form's targets (a multiple of redis-cell's);
- XCLOAK.REFUND's server CPU per call against the window's entries, of the
  newest entry and of a middle stamp, on both forms.

Run by `make bench` with a pinned matplotlib.

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


def memory_panel(ax, data):
    rows = data["used"]
    limits = [row[0] for row in rows]
    for layout, label, colour, marker in SERIES:
        values = [row[1][layout] for row in rows]
        ax.plot(limits, values, marker=marker, color=colour, label=label, linewidth=2, markersize=6)
        offset, align = {"script": ((-7, 6), "right"), "compact": ((7, 4), "left"), "cell": ((7, -12), "left")}.get(
            layout, ((-7, -13), "right")
        )
        for x, y in zip(limits, values):
            ax.annotate(human(y), (x, y), textcoords="offset points", xytext=offset, ha=align, fontsize=8, color=colour)
    targets = data.get("gcra_targets") or {}
    if targets:
        cell = {row[0]: row[1]["cell"] for row in rows}
        xs = [x for x in limits if str(x) in targets]
        ax.plot(
            xs,
            [targets[str(x)] * cell[x] for x in xs],
            linestyle="none",
            marker="_",
            markersize=14,
            markeredgewidth=2,
            color="#1f77b4",
            alpha=0.6,
            label="compact target: %s x redis-cell" % " / ".join("%g" % targets[str(x)] for x in xs),
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(limits[0] / 2.2, limits[-1] * 2.2)
    ax.set_xticks(limits)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: "{:,.0f}".format(v)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human(v)))
    ax.set_xlabel("limit (requests per 60 s window), window filled to the limit")
    ax.set_ylabel("used_memory per identity (10,000 identities)")
    ax.set_title("Memory per rate-limited identity", fontsize=11)
    ax.grid(True, which="major", color="#e5e5e5")
    ax.legend(fontsize=7.5, loc="upper left", framealpha=0.95)


def refund_panel(ax, data):
    rows = data["refunds"]
    sizes = [row[0] for row in rows]
    for form, index, label, colour, style in (
        ("compact", 0, "compact: the newest entry", "#1f77b4", "-"),
        ("compact", 1, "compact: a middle stamp", "#1f77b4", "--"),
        ("zset", 0, "sorted set: the newest entry", "#ff7f0e", "-"),
        ("zset", 1, "sorted set: a middle stamp", "#ff7f0e", "--"),
    ):
        values = [row[1][form][index] for row in rows]
        ax.plot(sizes, values, style, marker="o", color=colour, label=label, linewidth=2, markersize=5)
    ax.set_xscale("log")
    ax.set_xticks(sizes)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: "{:,.0f}".format(v) if v < 1e6 else "1M"))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("entries in the window")
    ax.set_ylabel("XCLOAK.REFUND, server usec per call")
    ax.set_title("REFUND's cost against the window's size", fontsize=11)
    ax.grid(True, which="major", color="#e5e5e5")
    ax.legend(fontsize=7.5, loc="upper left", framealpha=0.95)


def main():
    data = json.load(open(sys.argv[1]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5.2), dpi=110, gridspec_kw={"width_ratios": [1.25, 1]})
    memory_panel(left, data)
    refund_panel(right, data)
    fig.text(
        0.99,
        0.01,
        "make bench, %s, xcloak %s, %s" % (data["server"], data["commit"], data["date"]),
        ha="right",
        fontsize=7,
        color="#777777",
    )
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(sys.argv[2])


if __name__ == "__main__":
    main()
