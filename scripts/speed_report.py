#!/usr/bin/env python3
"""Writes docs/results/speed.md from the JSON that scripts/speed_bench.py wrote: the bench's own
table, and each goal's ratio with whether it is met. Every number in the Markdown comes from the
JSON. Python 3 standard library only.

Usage: python3 scripts/speed_report.py [docs/results/speed.json] [docs/results/speed.md]
"""

import json
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "docs/results/speed.json"
dst = sys.argv[2] if len(sys.argv) > 2 else "docs/results/speed.md"
d = json.load(open(src, encoding="utf-8"))
s = d["summary"]
load = d["load_average_1min"]
out = ["# Speed: raptor beside Opacus and PyTorch on the one-command workload", ""]
out.append(
    "Measured by `scripts/speed_bench.py` (its header gives the versions, the setup and the\n"
    "workload): all-MiniLM-L6-v2 with LoRA r 8 on the attention of layers 3–5 plus a new head,\n"
    "records of 128 tokens, AdamW; the private modes clip per record at 1.0 with noise multiplier\n"
    "1.0. Every mode runs in its own process on one libtorch thread, interleaved in rounds; raptor\n"
    "runs the trainer's own update (Poisson sample, clipping, noise, the accountant's charge)\n"
    "through the `minilm_speed` example of raptor-train. The raw numbers are in\n"
    "[speed.json](speed.json); this page is written from it by `scripts/speed_report.py`.\n"
)
v = d["versions"]
m = d["machine"]
out.append(
    f"Run: raptor commit {d['raptor_commit']}, {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB), "
    f"torch {v['torch']}, Opacus {v['opacus']}, transformers {v['transformers']}, PEFT {v['peft']}; "
    f"{d['steps']} timed steps × {d['rounds']} rounds per mode, {d['wall_seconds'] / 60:.0f} min in all. "
    + (
        f"**The machine was loaded** (1-minute load average {load['min']:.1f}–{load['max']:.1f} "
        f"on {m['cores']} cores, median {load['median']:.1f}): wall times are inflated and noisy; "
        "the CPU-time ratios are the steadier reading.\n"
        if load["median"] > 1.0
        else f"1-minute load average {load['min']:.1f}–{load['max']:.1f}.\n"
    )
)
out.append("```text\n" + d["table"].rstrip() + "\n```\n")
out.append("## Against the goals\n")
out.append(
    "Goals: raptor's private run at most 0.75× Opacus's best mode; raptor's non-private step at\n"
    "parity with PyTorch's (at most 1.00×).\n"
)


def met(x, goal):
    return "met" if x <= goal else "**not met**"


for b, r in s.items():
    w, c, modes = r["wall_median"], r["cpu_median"], r["modes"]
    best = w["opacus_best_mode"]
    out.append(
        f"- B = {b}: private one-command run (6 epochs, the first uncached) over Opacus {best}: "
        f"{w['raptor_dp_run_over_opacus_best']:.2f} wall ({met(w['raptor_dp_run_over_opacus_best'], 0.75)}), "
        f"{c['raptor_dp_run_over_opacus_best']:.2f} CPU ({met(c['raptor_dp_run_over_opacus_best'], 0.75)}); "
        f"without the frozen-prefix cache {w['raptor_dp_uncached_over_opacus_best']:.2f} wall. "
        f"Non-private step over PyTorch's: {w['raptor_adam_cached_over_torch']:.2f} cached "
        f"({met(w['raptor_adam_cached_over_torch'], 1.0)}), {w['raptor_adam_uncached_over_torch']:.2f} uncached "
        f"({met(w['raptor_adam_uncached_over_torch'], 1.0)}) wall; "
        f"{c['raptor_adam_cached_over_torch']:.2f} / {c['raptor_adam_uncached_over_torch']:.2f} CPU. "
        f"Peak memory: raptor private {modes['raptor_dp']['peak_rss_mb']:.0f} MiB, Opacus {best} "
        f"{modes['opacus_' + best]['peak_rss_mb']:.0f} MiB "
        f"({modes['raptor_dp']['peak_rss_mb'] / modes['opacus_' + best]['peak_rss_mb']:.2f}×)."
    )
out.append("")
open(dst, "w", encoding="utf-8").write("\n".join(out))
