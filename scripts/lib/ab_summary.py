"""Per-row means of one A/B run's JSON (`vmm bench --json`, the file named by
argv[1]): what the scripts/*-ab.sh scripts print under their tables, one
line per compared row with the mean over its repetitions of each column.

Each script gives only what differs: the row's key and its columns, e.g.

    from ab_summary import table, metric, per_s, counter
    table("busy_balance", lambda r: str(r["busy_balance"]).lower(), [
        ("metric", metric, ".4g"),
        ("pushes/s", lambda r: per_s(r, counter(r, "busy_pushes")), ".0f"),
    ])

A report's counters cover the whole run, warm-up included: per second of
the measured window (`per_s`) they are an upper bound.
"""

import json
import sys


def metric(r):
    """The run's metric (its unit and direction are in the table above)."""
    return r["run"]["metric"]["value"]


def counter(r, name):
    """A scheduler counter of the run (0 where the build has none)."""
    return r["run"]["counters"].get(name, 0)


def per_s(r, x):
    """x per second of the run's measured window."""
    return x / r["run"]["duration_s"]


def table(label, key, cols, path=None):
    """Prints one line per row (`key(report)`, in the JSON's order): the
    row's name, its repetitions and, per column (header, fn(report),
    format spec), the mean of fn over them."""
    with open(path or sys.argv[1]) as f:
        reports = json.load(f)["reports"]
    rows = {}
    for r in reports:
        rows.setdefault(str(key(r)), []).append([fn(r) for _, fn, _ in cols])
    kw = max([len(label)] + [len(k) for k in rows]) + 1
    widths = [max(len(h), 10) for h, _, _ in cols]
    head = f"{label:<{kw}} {'runs':>4}"
    for (h, _, _), w in zip(cols, widths):
        head += f" {h:>{w}}"
    print(head)
    for k, v in rows.items():
        n = len(v)
        line = f"{k:<{kw}} {n:>4}"
        for i, ((_, _, spec), w) in enumerate(zip(cols, widths)):
            mean = sum(x[i] for x in v) / n
            line += f" {mean:>{w}{spec}}"
        print(line)
