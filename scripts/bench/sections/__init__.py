"""The bench's sections. Each runs on a Server it is given and returns plain
data (dicts, lists, numbers: what report.py renders and results.json holds).
They import resp, server, deps, workloads and callgrind, never each other."""
