#!/usr/bin/env python3
"""Does every method the one command offers learn? (docs/results/one-command.md)

For each set and each method, runs

    raptor train --data <train> --validation <validation> --method <method> --runs-dir ...

with the release `raptor` binary under `/usr/bin/time -v` (one run per cell), and writes
<out>/runs.json and <out>/table.md: validation accuracy, the majority-class share of the
validation records, the 95 % Wilson interval of the accuracy, whether the run learned (the rule
below), certified epsilon, the learning rate the rule gave, wall time, CPU time, peak RSS, and
the machine's load average before and after the run.

The rule (written before the runs): a method LEARNS on a set when the lower end of the 95 %
Wilson interval of its validation accuracy lies above the share of the validation records'
most frequent label (what a constant prediction scores).

With `--lr X` the run's config is first written by `raptor init` with the same arguments, its
`train.lr` replaced by X (the other settings as the rule gives them), and trained with
`raptor train --config`: the learning-rate candidates of the rule's selection runs
(`--override KEY=VALUE` replaces another line of it, e.g. `momentum=0.9`).

Sets are given as name=train_file:validation_file (CSV/TSV/JSONL with a header; the columns are
detected as the one command detects them). `scripts/one_command_sets.py` cuts the sets of
docs/results/one-command.md from the cache's corpora.

Usage: python3 scripts/one_command_methods.py <raptor binary> <out dir> --set NAME=TRAIN:VALID
           [--set ...] [--method M ...] [--lr X] [--epsilon E]
"""

import argparse
import csv
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

METHODS = [
    "dp-adam", "dp-sgd", "dp-muon", "dp-muonbc", "adam", "muon",
    "raptor", "shared-only", "expert-only", "matched-scope", "dp-adam-lora", "dp-adam-full",
    "lora", "full",
]


def labels_of(path):
    """The label column of a table, found as the first column named label/labels/class/..."""
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".jsonl"):
        rows = [json.loads(l) for l in text.splitlines() if l.strip()]
        key = next(k for k in rows[0] if k.lower() in ("label", "labels", "class", "target"))
        return [str(r[key]) for r in rows]
    delim = "\t" if path.endswith(".tsv") else ","
    reader = csv.DictReader(text.splitlines(), delimiter=delim)
    key = next(k for k in reader.fieldnames if k.lower() in ("label", "labels", "class", "target"))
    return [row[key] for row in reader]


def wilson(k, n, z=1.959963984540054):
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - h, c + h)


def timed(cmd, log):
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-v"] + cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    return {
        "wall_seconds": wall,
        "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mib": int(m.group(1)) / 1024 if m else None,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def metrics(run):
    """The run's final validation metrics, from record.json or, when the validation records are
    not declared public, private/record.json."""
    rec = json.loads((run / "record.json").read_text())
    for src in (rec, json.loads((run / "private" / "record.json").read_text())):
        for key in ("validation_metrics", None):
            v = src.get(key) if key else src
            if v and v.get("eval"):
                return rec, v["eval"]
    raise SystemExit(f"{run}: no validation metrics")


def one(binary, name, train, valid, method, lr, epsilon, out, overrides=()):
    tag = f"lr{lr:g}" if lr is not None else "rule"
    tag += "".join("-" + re.sub(r"[^A-Za-z0-9.]+", "", kv) for kv in overrides)
    runs = out / f"{name}-{method}" / tag
    runs.mkdir(parents=True, exist_ok=True)
    base = ["--data", train, "--validation", valid, "--method", method, "--epsilon", str(epsilon)]
    if lr is None:
        cmd = [binary, "train"] + base + ["--runs-dir", str(runs)]
    else:
        init = subprocess.run([binary, "init"] + base, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, check=True).stdout
        text, n = re.subn(r"(?m)^lr = .*$", f"lr = {lr!r}", init)
        if n != 1:
            raise SystemExit(f"raptor init wrote {n} `lr =` lines")
        for kv in overrides:
            key, value = kv.split("=", 1)
            text, n = re.subn(rf"(?m)^{re.escape(key.strip())} = .*$",
                              f"{key.strip()} = {value.strip()}", text)
            if n != 1:
                raise SystemExit(f"raptor init wrote {n} `{key.strip()} =` lines")
        cfg = runs / "run.toml"
        cfg.write_text(text)
        cmd = [binary, "train", "--config", str(cfg), "--runs-dir", str(runs)]
    before = set(p.parent for p in runs.glob("*/record.json"))
    t = timed(cmd, runs / "log.txt")
    new = [p.parent for p in runs.glob("*/record.json") if p.parent not in before]
    if len(new) != 1:
        raise SystemExit(f"{runs}: expected one new run folder, found {new}")
    run = new[0]
    rec, ev = metrics(run)
    cfg_text = (run / "config.toml").read_text()
    lr_used = float(re.search(r"(?m)^lr = (.*)$", cfg_text).group(1))
    ys = labels_of(valid)
    majority = Counter(ys).most_common(1)[0][1] / len(ys)
    n = ev["records"]
    k = round(ev["accuracy"] * n)
    lo, hi = wilson(k, n)
    eps = rec.get("epsilon")
    return dict(
        t,
        set=name,
        method=method,
        overrides=list(overrides),
        run=str(run),
        lr=lr_used,
        accuracy=ev["accuracy"],
        loss=ev["loss"],
        validation_records=n,
        majority=majority,
        wilson=[lo, hi],
        learns=lo > majority,
        epsilon=eps["upper"] if eps else None,
        updates=rec["updates"],
        expected_batch=rec["privacy_plan"]["expected_batch"],
        train_records=rec["train_records"],
    )


def table(results):
    rows = [
        "| set | method | lr | accuracy % (95 % CI) | majority % | learns | certified ε | "
        "updates × B | wall | CPU | peak RSS | load before/after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        eps = f"{r['epsilon']:.3f}" if r["epsilon"] is not None else "— (∞)"
        rows.append(
            f"| {r['set']} | `{r['method']}` | {r['lr']:g}{''.join(', ' + o for o in r.get('overrides', []))} | {100 * r['accuracy']:.1f} "
            f"({100 * r['wilson'][0]:.1f}–{100 * r['wilson'][1]:.1f}) | {100 * r['majority']:.1f} | "
            f"{'yes' if r['learns'] else '**no**'} | {eps} | {r['updates']} × {r['expected_batch']:.0f} | "
            f"{r['wall_seconds'] / 60:.1f} min | {r['cpu_seconds'] / 60:.1f} min | "
            f"{r['peak_rss_mib'] / 1024:.2f} GiB | {r['load_before']:.1f}/{r['load_after']:.1f} |"
        )
    return "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("out", type=Path)
    ap.add_argument("--set", action="append", required=True, dest="sets")
    ap.add_argument("--method", action="append", dest="methods")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--override", action="append", default=[],
                    help="with --lr: KEY=VALUE replacing the config's `KEY = ...` line")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results_path = a.out / "runs.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else []
    for spec in a.sets:
        name, files = spec.split("=", 1)
        train, valid = files.split(":", 1)
        for method in a.methods or METHODS:
            print(f"{name}: {method} (lr {a.lr if a.lr is not None else 'by the rule'}) ...",
                  file=sys.stderr, flush=True)
            r = one(a.binary, name, train, valid, method, a.lr, a.epsilon, a.out, a.override)
            print(f"  accuracy {100 * r['accuracy']:.1f} % (majority {100 * r['majority']:.1f}), "
                  f"{r['wall_seconds'] / 60:.1f} min, {r['peak_rss_mib'] / 1024:.2f} GiB",
                  file=sys.stderr, flush=True)
            results.append(r)
            results_path.write_text(json.dumps(results, indent=2))
            (a.out / "table.md").write_text(table(results))


if __name__ == "__main__":
    main()
