"""The conformance vectors (clients/conformance/vectors.json), loaded once."""

from __future__ import annotations

import json
import os
from pathlib import Path

from servers import REPO

PATH = Path(os.environ.get("XCLOAK_VECTORS", REPO / "clients/conformance/vectors.json"))
DATA = json.loads(PATH.read_text())
CASES = DATA["cases"]


def steps(*ops):
    for case in CASES:
        for i, step in enumerate(case["steps"]):
            if not ops or step["op"] in ops:
                yield case["name"], i, step


def tiers_of(step):
    return [tuple(t) for t in step.get("tiers", [])]


def decode(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value
