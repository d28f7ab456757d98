"""Figures quoted in the docs against the run of record, without a server.

A figure quoted outside the generated page carries a marker right after it,
naming its key in the result data (docs/performance.json):

    compact costs 0.45<!-- bench:commands.main.rows.allow_compact.pipelined.usec --> usec per call

The marker is an HTML comment: Markdown shows the figure alone. The figure is
the number just before the marker (commas allowed, then an optional unit such
as `x`, `%` or ` B` between the number and the marker). A quote fails when its
key is not in the data, when it differs from the data's value written with as
many decimals as the quote has, or when another quote of the same key reads
differently (at the coarser quote's precision: 7.4 and 7.36 agree).
Usage: python3 -m scripts.bench.check_docs [FILE.md ...]
(default: README.md, docs/*.md and clients/*/README.md); exit status 1 on any failure. Imports
results only."""

import glob
import os
import re
import sys

from . import results

MARKER = re.compile(
    r"(?P<figure>[-+]?\d[\d,]*(?:\.(?P<decimals>\d+))?)(?P<unit>x|%| ?(?:B|kB|MB|usec|ms|s))?"
    r"<!-- bench:(?P<key>[\w.\-]+) -->"
)
ANY_MARKER = re.compile(r"<!-- bench:(?P<key>[\w.\-]+) -->")


def default_files():
    return (
        [os.path.join(results.ROOT, "README.md")]
        + sorted(glob.glob(os.path.join(results.ROOT, "docs", "*.md")))
        + sorted(glob.glob(os.path.join(results.ROOT, "clients", "*", "README.md")))
    )


def quotes(path):
    """[(line number, key, figure text, decimals, problem or None)] of one file."""
    out = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            figures = {m.start("key"): m for m in MARKER.finditer(line)}
            for marker in ANY_MARKER.finditer(line):
                m = figures.get(marker.start("key"))
                if m is None:
                    out.append((number, marker.group("key"), None, 0, "a marker with no figure right before it"))
                else:
                    decimals = len(m.group("decimals") or "")
                    out.append((number, m.group("key"), m.group("figure").replace(",", ""), decimals, None))
    return out


def check(paths, data):
    """The failures (text, one per problem) of the quotes in `paths` against `data` (flat keys)."""
    failures, seen = [], {}
    for path in paths:
        name = os.path.relpath(path, results.ROOT) if path.startswith(results.ROOT) else path
        for number, key, figure, decimals, problem in quotes(path):
            where = "%s:%d" % (name, number)
            if problem:
                failures.append("%s: %s (%s)" % (where, problem, key))
                continue
            if key not in data or not isinstance(data[key], (int, float)):
                failures.append("%s: %s quotes %s, which the data does not hold" % (where, figure, key))
            else:
                expected = "%.*f" % (decimals, data[key])
                if float(expected) != float(figure):
                    failures.append(
                        "%s: %s quotes %s, the data has %s (%r)" % (where, key, figure, expected, data[key])
                    )
            if key in seen:
                # Two quotes agree when they read the same at the coarser one's precision (7.4 and 7.36 do).
                other_where, other, other_decimals = seen[key]
                coarse = min(decimals, other_decimals)
                if "%.*f" % (coarse, float(figure)) != "%.*f" % (coarse, float(other)):
                    failures.append("%s: %s quoted as %s, but as %s at %s" % (where, key, figure, other, other_where))
            seen.setdefault(key, (where, figure, decimals))
    return failures


def main(args):
    paths = args or default_files()
    failures = check(paths, results.load_flat())
    for failure in failures:
        print("check_docs: " + failure)
    count = sum(len(quotes(p)) for p in paths)
    if failures:
        sys.exit(1)
    print(
        "check_docs: %d quoted figures in %d files agree with %s"
        % (count, len(paths), os.path.relpath(results.DATA, results.ROOT))
    )


if __name__ == "__main__":
    main(sys.argv[1:])
