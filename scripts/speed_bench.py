"""raptor beside Opacus and PyTorch on the one-command workload, in one run: time per epoch and
peak memory, as ratios.

Versions (the environment the committed results were measured in):
    Python 3.11, torch 2.11.0 (CPU), opacus 1.6.0, transformers 5.23.0, peft 0.21.2;
    raptor: the `minilm_speed` example of crate raptor-train at the commit being measured,
    built with `--release` against libtorch 2.11.0.

Setup (a venv outside the repository; torch from the libtorch venv of `cargo xtask setup`):
    python3 -m venv ~/.cache/raptor/bench-venv
    echo ~/.cache/raptor/torch-2.11.0-cpu/lib/python3.11/site-packages \
        > ~/.cache/raptor/bench-venv/lib/python3.11/site-packages/raptor-torch.pth
    ~/.cache/raptor/bench-venv/bin/pip install torch==2.11.0 opacus==1.6.0 \
        transformers==5.23.0 peft==0.21.2
    cargo build --release -p raptor-train --example minilm_speed
Run:
    ~/.cache/raptor/bench-venv/bin/python scripts/speed_bench.py [--rounds 3] [--batches 64,256]
        [--steps 3] [--threads 1] [--out docs/results/speed.json]

Workload (the `raptor train --data` default): all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384),
mean pooling, a new 2-class linear head; LoRA r 8, alpha 16, no dropout, on the attention
projections (query, key, value, attention output) of layers 3-5, plus the head; AdamW lr 0.01;
per-record clip 1.0, noise multiplier 1.0 for the private modes. B records of T = 128 tokens
([CLS], ids from a fixed generator, [SEP]: the same ids on both sides), one micro-batch of at most
64 records for raptor (its one-command setting), the whole batch at once for PyTorch and Opacus.
No hidden or attention dropout on any side (raptor's BERT has none). Every mode runs on
`--threads` libtorch threads (default 1, as in OMP_NUM_THREADS=1: on a machine shared with other
work, a team of OpenMP threads waits at a barrier after every operation whenever one of its
threads is descheduled, which measures the machine's load rather than the code).

Modes, each timed in its own process (so its peak memory is its own), interleaved in rounds:
    torch           plain PyTorch: transformers BertModel + PEFT LoRA, forward, backward, AdamW
    opacus_hooks    Opacus 1.6 make_private, per-sample gradients by hooks ("hooks")
    opacus_ghost    Opacus 1.6 make_private, fast gradient clipping ("ghost": ghost norms, two
                    backward passes)
    raptor_dp       raptor DP-Adam (the trainer's update: Poisson sample at q = 1, per-record
                    clipping, noise, the accountant's charge, AdamW), frozen-prefix cache on
    raptor_dp_nocache   the same with train.prefix_cache = "off"
    raptor_adam     raptor's non-private LoRA update (method adam), cache on
    raptor_adam_nocache the same, cache off
Each process: model and data built, one untimed warm-up step, peak RSS reset
(/proc/self/clear_refs), `--steps` timed steps, then VmHWM. With q = 1 every raptor update draws
all B records, so after the warm-up its cache holds them all: the timed cached steps are those of
an epoch after the first, the uncached ones those of the first epoch.

Epochs: the default rule takes B = N/8, so one epoch is 8 updates; the time of an epoch is 8 x the
median step. The one-command run trains about 6 epochs, the first without a filled cache: its
mean epoch is (1 x uncached + 5 x cached) / 6, what the headline ratio compares with Opacus's
faster mode.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "target" / "release" / "examples" / "minilm_speed"
MODES = ["torch", "opacus_hooks", "opacus_ghost", "raptor_dp", "raptor_dp_nocache",
         "raptor_adam", "raptor_adam_nocache"]
UPDATES_PER_EPOCH = 8
EPOCHS = 6


def cache_dir():
    if os.environ.get("RAPTOR_CACHE_DIR"):
        return Path(os.environ["RAPTOR_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "raptor"
    return Path.home() / ".cache" / "raptor"


def records(n, t):
    """The ids raptor's example makes (same generator)."""
    s = 12345
    out = []
    for _ in range(n):
        rec = [101]
        for _ in range(t - 2):
            s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            rec.append(1000 + ((s >> 33) % 29000))
        rec.append(102)
        out.append(rec)
    return out


def vm(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return float(line.split()[1]) / 1024.0
    return float("nan")


def child(mode, b, t, steps, model_dir, threads):
    import torch
    torch.set_num_threads(threads)
    import torch.nn as nn
    from transformers import BertConfig, BertModel
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    cfg = BertConfig.from_pretrained(model_dir)
    cfg.hidden_dropout_prob = 0.0
    cfg.attention_probs_dropout_prob = 0.0
    bert = BertModel.from_pretrained(model_dir, config=cfg, add_pooling_layer=False)
    lora = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0,
        target_modules=r".*layer\.(3|4|5)\.attention\.(self\.(query|key|value)|output\.dense)")
    bert = inject_adapter_in_model(lora, bert)

    class Classifier(nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert
            self.classifier = nn.Linear(cfg.hidden_size, 2)

        def forward(self, ids, mask):
            h = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(h.dtype)
            return self.classifier((h * m).sum(1) / m.sum(1))

    model = Classifier(bert)
    for n, p in model.named_parameters():
        p.requires_grad = ("lora_" in n) or n.startswith("classifier")
    model.train()
    ids = torch.tensor(records(b, t))
    mask = torch.ones_like(ids)
    y = torch.arange(b) % 2
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)
    crit = nn.CrossEntropyLoss()
    if mode == "torch":
        def step():
            opt.zero_grad(set_to_none=True)
            crit(model(ids, mask), y).backward()
            opt.step()
    else:
        from opacus import PrivacyEngine
        ds = torch.utils.data.TensorDataset(ids, mask, y)
        dl = torch.utils.data.DataLoader(ds, batch_size=b)
        pe = PrivacyEngine(accountant="prv")
        kw = dict(module=model, optimizer=opt, data_loader=dl, noise_multiplier=1.0,
                  max_grad_norm=1.0, poisson_sampling=False)
        if mode == "opacus_ghost":
            pmodel, popt, pcrit, _ = pe.make_private(**kw, criterion=crit,
                                                      grad_sample_mode="ghost")
        else:
            pmodel, popt, _ = pe.make_private(**kw, grad_sample_mode="hooks")
            pcrit = crit

        def step():
            popt.zero_grad(set_to_none=True)
            pcrit(pmodel(ids, mask), y).backward()
            popt.step()
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(json.dumps({"first_step_seconds": first, "step_seconds": times,
                      "step_cpu_seconds": cpu,
                      "peak_rss_mb": vm("VmHWM:"), "threads": torch.get_num_threads()}))


def measure(mode, b, t, steps, model_dir, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if mode.startswith("raptor"):
        method = "dp-adam" if mode.startswith("raptor_dp") else "adam"
        cache = "off" if mode.endswith("nocache") else "on"
        cmd = [str(EXAMPLE), "--method", method, "--batch", str(b), "--tokens", str(t),
               "--steps", str(steps), "--cache", cache, "--model", str(model_dir)]
    else:
        cmd = [sys.executable, __file__, "--child", mode, "--batch", str(b), "--tokens", str(t),
               "--steps", str(steps), "--model", str(model_dir), "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{mode} B={b} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine():
    cpu = "unknown"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = 0.0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem = float(line.split()[1]) / 1024 / 1024
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem, 1),
            "kernel": platform.release()}


def summary(results, batches):
    """Per batch size and mode: median and minimum step seconds (wall clock), median CPU
    seconds, median peak RSS; epoch times and ratios from the medians."""
    out = {}
    for b in batches:
        rows = {}
        for m in MODES:
            runs = results[str(b)][m]
            wall = [s for r in runs for s in r["step_seconds"]]
            cpu = [s for r in runs for s in r["step_cpu_seconds"]]
            rows[m] = {"wall_median": statistics.median(wall), "wall_min": min(wall),
                       "cpu_median": statistics.median(cpu),
                       "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs)}
        res = {"modes": rows}
        for clock in ("wall_median", "cpu_median", "wall_min"):
            best = min(rows["opacus_hooks"][clock], rows["opacus_ghost"][clock])
            run = (rows["raptor_dp_nocache"][clock]
                   + (EPOCHS - 1) * rows["raptor_dp"][clock]) / EPOCHS
            res[clock] = {
                "opacus_best_mode": "hooks" if rows["opacus_hooks"][clock] <= rows["opacus_ghost"][clock] else "ghost",
                "raptor_dp_run_over_opacus_best": run / best,
                "raptor_dp_cached_over_opacus_best": rows["raptor_dp"][clock] / best,
                "raptor_dp_uncached_over_opacus_best": rows["raptor_dp_nocache"][clock] / best,
                "raptor_adam_cached_over_torch": rows["raptor_adam"][clock] / rows["torch"][clock],
                "raptor_adam_uncached_over_torch": rows["raptor_adam_nocache"][clock] / rows["torch"][clock],
            }
        out[str(b)] = res
    return out


def table(summ, batches):
    lines = []
    for b in batches:
        rows = summ[str(b)]["modes"]
        t = rows["torch"]
        lines.append(f"\nB = {b} (epoch = {UPDATES_PER_EPOCH} updates; ratios of medians):")
        lines.append(f"{'mode':22} {'wall s':>7} {'min s':>7} {'cpu s':>7} {'epoch s':>8} "
                     f"{'wall/torch':>10} {'cpu/torch':>9} {'peak MiB':>9} {'mem/torch':>9}")
        for m in MODES:
            r = rows[m]
            lines.append(f"{m:22} {r['wall_median']:7.2f} {r['wall_min']:7.2f} "
                         f"{r['cpu_median']:7.2f} {UPDATES_PER_EPOCH * r['wall_median']:8.1f} "
                         f"{r['wall_median'] / t['wall_median']:10.2f} "
                         f"{r['cpu_median'] / t['cpu_median']:9.2f} {r['peak_rss_mb']:9.0f} "
                         f"{r['peak_rss_mb'] / t['peak_rss_mb']:9.2f}")
        for clock in ("wall_median", "cpu_median", "wall_min"):
            c = summ[str(b)][clock]
            lines.append(f"  [{clock}] one-command run ({EPOCHS} epochs, the first uncached): raptor "
                         f"DP-Adam / Opacus {c['opacus_best_mode']} = "
                         f"{c['raptor_dp_run_over_opacus_best']:.2f} (cached epoch "
                         f"{c['raptor_dp_cached_over_opacus_best']:.2f}, uncached "
                         f"{c['raptor_dp_uncached_over_opacus_best']:.2f}); raptor non-private / "
                         f"torch: cached {c['raptor_adam_cached_over_torch']:.2f}, uncached "
                         f"{c['raptor_adam_uncached_over_torch']:.2f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=1,
                    help="libtorch / PyTorch threads of every mode (OMP_NUM_THREADS)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "speed.json"))
    a = ap.parse_args()
    model_dir = Path(a.model) if a.model else cache_dir() / "models" / "all-minilm-l6-v2"
    if a.child:
        child(a.child, a.batch, a.tokens, a.steps, str(model_dir), a.threads)
        return
    if not EXAMPLE.exists():
        raise SystemExit(f"build {EXAMPLE} first: cargo build --release -p raptor-train "
                         "--example minilm_speed")
    if not (model_dir / "model.safetensors").exists():
        raise SystemExit(f"{model_dir}: the MiniLM checkpoint is missing (run the example once "
                         "without --model, or `cargo xtask setup --models`)")
    import torch
    import opacus
    import transformers
    import peft
    threads = a.threads
    batches = [int(x) for x in a.batches.split(",")]
    modes = a.modes.split(",")
    load = [os.getloadavg()[0]]
    results = {str(b): {m: [] for m in modes} for b in batches}
    started = time.time()
    for r in range(a.rounds):
        for b in batches:
            # Rotate the order each round: no mode always runs first or last.
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for m in order:
                res = measure(m, b, a.tokens, a.steps, model_dir, threads)
                results[str(b)][m].append(res)
                print(f"round {r} B={b} {m}: steps {['%.3f' % s for s in res['step_seconds']]} "
                      f"peak {res['peak_rss_mb']:.0f} MiB", flush=True)
                load.append(os.getloadavg()[0])
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    out = {
        "raptor_commit": commit,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "opacus": opacus.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__},
        "machine": machine(),
        "threads": threads,
        "load_average_1min": {"min": min(load), "median": statistics.median(load),
                              "max": max(load)},
        "wall_seconds": time.time() - started,
        "tokens": a.tokens, "steps": a.steps, "rounds": a.rounds,
        "results": results,
    }
    if set(modes) == set(MODES):
        out["summary"] = summary(results, batches)
        out["table"] = table(out["summary"], batches)
        print(out["table"])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
