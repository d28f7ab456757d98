"""The result data of a run, and its flat keys. docs/performance.json holds the
run of record as the sections returned it; `flatten` names every figure by a
dotted key (`commands.main.ratios.script_over_allow_compact`,
`fallback.rejections.ratios.details_over_article`; a list of records is keyed
by each record's limit, entries or keys field:
`entries.compact.rows.1000000.admission`), the
keys targets.toml and the docs' quoted figures name. Imports deps (for the
path) only."""

import json
import os

from .deps import ROOT

DATA = os.path.join(ROOT, "docs/performance.json")


ID_FIELDS = ("limit", "entries", "keys")


def record_id(record):
    """A record's key in a list: its limit, entries or keys field (else its first field)."""
    return next((record[f] for f in ID_FIELDS if f in record), next(iter(record.values())))


def flatten(data, prefix=""):
    """{dotted key: number or text} of the numbers and texts in nested data."""
    out = {}
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        items = ((str(record_id(x)), x) for x in data)
    elif isinstance(data, list):
        items = ((str(i), x) for i, x in enumerate(data))
    else:
        return {prefix: data} if prefix and (data is None or isinstance(data, (int, float, str))) else {}
    for key, value in items:
        out.update(flatten(value, "%s.%s" % (prefix, key) if prefix else str(key)))
    return out


def save(data, path=DATA):
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def load(path=DATA):
    """The run of record as the sections returned it (nested)."""
    with open(path) as f:
        return json.load(f)


def load_flat(path=DATA):
    return flatten(load(path))
