"""The targets: targets.toml read with tomllib and checked against the result
data (flat keys, results.py). Imports nothing of the package."""

import operator
import os
import tomllib

FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.toml")
COMPARISONS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
FIELDS = {"name", "measure", "comparison", "limit", "unit", "source", "detail"}


def load(path=FILE):
    """The targets, each a dict; a malformed entry stops the bench with its name."""
    with open(path, "rb") as f:
        entries = tomllib.load(f).get("target", [])
    for t in entries:
        missing = {"name", "measure", "comparison", "limit", "source"} - set(t)
        unknown = set(t) - FIELDS
        if missing or unknown or t["comparison"] not in COMPARISONS:
            raise ValueError(
                "targets.toml: %r: missing %s, unknown %s, comparison %r"
                % (t.get("name"), sorted(missing), sorted(unknown), t.get("comparison"))
            )
    return entries


def show(value, unit):
    if value is None:
        return "not measured"
    if unit == "x":
        return "%.2fx" % value
    if unit == "B":
        return "{:,.0f} B".format(value) if value >= 10 else "%.2f B" % value
    return "%.3g" % value


def check(targets, data):
    """[(target, value or None, passed)] in the file's order; a measure missing
    from the data (a section not run) has value None and fails."""
    out = []
    for t in targets:
        value = data.get(t["measure"])
        passed = value is not None and COMPARISONS[t["comparison"]](value, t["limit"])
        out.append((t, value, passed))
    return out


def detail(target, data):
    """The detail keys' values, as text ("usec" for a usec key, else the number)."""
    parts = []
    for key in target.get("detail", []):
        if key in data and data[key] is not None:
            value = data[key]
            parts.append(
                "%.2f usec" % value
                if ".usec." in key or key.endswith(".usec")
                else "{:,.0f} B".format(value)
                if ".bytes." in key
                else "%.2fx" % value
            )
    return ", ".join(parts)
