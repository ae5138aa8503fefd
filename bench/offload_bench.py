#!/usr/bin/env python3
"""Offload benchmark: one model trained in RAM and under a memory budget, in the same run.

Default: GPT-2 small (L12 C768 H12, vocab 50257), B=4, T=256, budget = 25% of the training state
(params + grads + AdamW moments, 16 bytes per parameter; with --optimizer zo-sgd the parameters
alone, 4 bytes per parameter). Runs alternate RAM / budget for
--rounds rounds (the machines are noisy); per configuration it reports the median step time
(first step of each run excluded), the ratio to RAM, stall per step, bytes read/written per
step, the read/write bandwidth the disk delivered while busy against the best of a short
io_sweep on the same directory, peak RSS against the budget, which case of issue 14's rule the
machine is in (the step's bytes at the sweep's rates against the in-RAM step), and the plan's
update window (Note [update window] in src/plan/planner.h): the bytes that must cross the disk
between the gradient norm and the head, their time at the sweep's rates, and the step's floor
that gives on this disk. Prints a table and a JSON line.

Usage: python3 bench/offload_bench.py --dir /path/on/nvme [--steps 5] [--rounds 2]
           [--budget-frac 0.25,0.10] [--grad-clip 1.0] [--prefetch K] [--io auto] [--no-sweep]
           [--optimizer adamw|zo-sgd] [--activations auto,recompute,offload] [--precision fp32|bf16]
--activations: the policies the budgeted runs use, each run at each budget (default auto: the
plan's choice, which the report names); the run in RAM recomputes.
A budget fraction below the run's minimum budget runs at the minimum (and says so). Without
--prefetch the runs use the plan's choice; the plan's predicted step time is reported next to
the measured median.
Needs a Release build in build/ (stratum, io_sweep) and ../shared/data (Tiny Shakespeare + GPT-2 BPE).
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATUM = os.path.join(ROOT, "build", "stratum")
SWEEP = os.path.join(ROOT, "build", "io_sweep")
DATA = os.path.join(ROOT, "..", "shared", "data")


def params_of(L, C, V, ctx):
    return V * C + ctx * C + L * (12 * C * C + 13 * C) + 2 * C


def run_train(args, budget, log, activations="recompute"):
    cmd = [STRATUM, "train", "--layers", str(args.layers), "--embd", str(args.embd), "--heads", str(args.heads),
           "--ctx", "1024", "--data", args.data, "--batch", str(args.batch), "--seq", str(args.seq), "--steps",
           str(args.steps), "--threads", str(args.threads), "--quiet", "--grad-clip", str(args.grad_clip),
           "--lr-schedule", "constant", "--log", log, "--optimizer", args.optimizer, "--precision", args.precision]
    if args.optimizer != "zo-sgd":
        cmd += ["--activations", activations]
    if args.optimizer == "zo-sgd":
        cmd += ["--lr", "1e-5"]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    if budget:
        cmd += ["--mem-budget", f"{budget >> 20}M", "--offload-dir", args.dir, "--io", args.io]
        if args.prefetch is not None:
            cmd += ["--prefetch", str(args.prefetch)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"offload_bench: {' '.join(cmd)} failed:\n{r.stderr}")
    steps = [json.loads(line) for line in open(log)]
    rss = re.search(r"peak RSS ([0-9.]+) MiB", r.stderr)
    rd = re.search(r"read [0-9.]+ [KMG]iB \(([0-9.]+) GB/s", r.stderr)
    wr = re.search(r"written [0-9.]+ [KMG]iB \(([0-9.]+) GB/s", r.stderr)
    h = re.search(r"params hash ([0-9a-f]+)", r.stderr)
    pf = re.search(r"prefetch (\d+) \(", r.stderr)
    chosen = re.search(r"activations (\w+) \(auto", r.stderr)
    return {"activations": chosen.group(1) if chosen else activations,
            "steps": steps[1:] if len(steps) > 1 else steps, "rss_mib": float(rss.group(1)),
            "prefetch": int(pf.group(1)) if pf else None,
            "read_gbps": float(rd.group(1)) if rd else 0.0, "write_gbps": float(wr.group(1)) if wr else 0.0,
            "hash": h.group(1)}


def run_plan(args, budget_arg, activations):
    """'stratum plan' for this run's shape and options at --mem-budget budget_arg (e.g. "474M")."""
    cmd = [STRATUM, "plan", "--layers", str(args.layers), "--embd", str(args.embd), "--heads", str(args.heads),
           "--ctx", "1024", "--batch", str(args.batch), "--seq", str(args.seq), "--grad-clip", str(args.grad_clip),
           "--threads", str(args.threads), "--mem-budget", budget_arg, "--offload-dir", args.dir,
           "--optimizer", args.optimizer, "--activations", activations, "--precision", args.precision]
    return subprocess.run(cmd, capture_output=True, text=True)


def min_budget_mib(args, activations="auto"):
    r = run_plan(args, "1M", activations)
    m = re.search(r"use --mem-budget (\d+)M", r.stderr)
    if not m:
        sys.exit(f"offload_bench: cannot read the minimum budget from 'stratum plan':\n{r.stderr}")
    return int(m.group(1))


def bytes_of(number, unit):
    return float(number) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]


def update_window(args, budget, activations):
    """The plan's update window at this budget (Note [update window] in src/plan/planner.h):
    (bytes read, bytes written, forward compute ms), or None where the run has none."""
    r = run_plan(args, f"{budget >> 20}M", activations)
    m = re.search(r"update window .*?: read ([0-9.]+) (B|KiB|MiB|GiB) \+ written ([0-9.]+) (B|KiB|MiB|GiB), "
                  r"[0-9.]+ ms of disk .*? against ([0-9.]+) ms of forward compute", r.stdout + r.stderr)
    if not m:
        return None
    return bytes_of(m.group(1), m.group(2)), bytes_of(m.group(3), m.group(4)), float(m.group(5))


def sweep_best(directory):
    r = subprocess.run([SWEEP, "--dir", directory, "--file-mib", "1024", "--blocks", "1M,4M", "--depths", "8,16"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"offload_bench: io_sweep failed:\n{r.stderr}")
    rd = re.search(r"best read:.*?([0-9.]+) GB/s", r.stdout)
    wr = re.search(r"best write:.*?([0-9.]+) GB/s", r.stdout)
    return float(rd.group(1)), float(wr.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="offload directory (on the disk to measure)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budget-frac", default="0.25", help="comma-separated fractions of the training state")
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--prefetch", type=int, default=None, help="default: the plan's choice")
    p.add_argument("--io", default="auto")
    p.add_argument("--data", default=os.path.join(DATA, "tinyshakespeare.txt"))
    p.add_argument("--tokenizer", default=DATA)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "zo-sgd"])
    p.add_argument("--activations", default="auto", help="comma-separated policies for the budgeted runs")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="the matrix products' (every run)")
    args = p.parse_args()
    policies = args.activations.split(",") if args.optimizer != "zo-sgd" else ["auto"]

    state = (4 if args.optimizer == "zo-sgd" else 16) * params_of(args.layers, args.embd, 50257, 1024)
    # Each policy's own minimum (auto's is the smaller of recompute's and offload's).
    min_budget = max(min_budget_mib(args, a) for a in policies) << 20
    budgets = [max(int(float(f) * state) >> 20 << 20, min_budget) for f in args.budget_frac.split(",")]
    best_read, best_write = (0.0, 0.0) if args.no_sweep else sweep_best(args.dir)
    print(f"machine: {os.cpu_count()} CPUs, load {open('/proc/loadavg').read().split()[:3]}")
    print(f"model L{args.layers} C{args.embd} H{args.heads}, B={args.batch} T={args.seq}, training state "
          f"{state / 2**20:.0f} MiB, minimum budget {min_budget >> 20} MiB, optimizer {args.optimizer}, precision {args.precision}, "
          f"grad clip {args.grad_clip}, "
          f"offload dir {args.dir}")
    cases = [(b, a) for b in budgets for a in policies]
    ram, off = [], [[] for _ in cases]
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        for _ in range(args.rounds):
            ram.append(run_train(args, 0, log))
            for i, (budget, activations) in enumerate(cases):
                off[i].append(run_train(args, budget, log, activations))
    if len({r["hash"] for r in ram + [x for runs in off for x in runs]}) != 1:
        sys.exit("offload_bench: parameters differ between RAM and budget runs: exactness is broken")

    def med(runs, key):
        return statistics.median(s[key] for r in runs for s in r["steps"])

    ram_ms = med(ram, "step_ms")
    print(f"in RAM:      {ram_ms:8.1f} ms/step, peak RSS {max(r['rss_mib'] for r in ram):.0f} MiB")
    for (budget, activations), runs in zip(cases, off):
        off_ms = med(runs, "step_ms")
        pred = med(runs, "predicted_step_ms")
        res = {
            "config": f"L{args.layers} C{args.embd} B{args.batch} T{args.seq}", "optimizer": args.optimizer,
            "precision": args.precision,
            "budget_mib": budget >> 20, "activations": activations, "activations_used": runs[0]["activations"],
            "budget_frac": round(budget / state, 3), "grad_clip": args.grad_clip, "prefetch": runs[0]["prefetch"],
            "ram_step_ms": round(ram_ms, 1), "offload_step_ms": round(off_ms, 1), "ratio": round(off_ms / ram_ms, 3),
            "predicted_step_ms": round(pred, 1), "prediction_error": round(pred / off_ms - 1, 3),
            "stall_ms_per_step": round(med(runs, "stall_ms"), 1),
            "read_mib_per_step": round(med(runs, "read_bytes") / 2**20, 1),
            "write_mib_per_step": round(med(runs, "write_bytes") / 2**20, 1),
            "read_gbps": round(statistics.median(r["read_gbps"] for r in runs), 2),
            "write_gbps": round(statistics.median(r["write_gbps"] for r in runs), 2),
            "sweep_best_read_gbps": best_read, "sweep_best_write_gbps": best_write,
            "ram_peak_rss_mib": max(r["rss_mib"] for r in ram), "offload_peak_rss_mib": max(r["rss_mib"] for r in runs),
            "offload_peak_engine_mib": round(max(s["peak_mem_bytes"] for r in runs for s in r["steps"]) / 2**20, 1),
        }
        print(f"budget {budget >> 20} MiB ({100 * budget / state:.1f}%), activations {activations}"
              f"{' -> ' + runs[0]['activations'] if activations == 'auto' else ''}: {off_ms:8.1f} ms/step = {res['ratio']:.3f}x RAM "
              f"(plan predicted {pred:.0f} ms, {100 * res['prediction_error']:+.0f}%); stall "
              f"{res['stall_ms_per_step']:.0f} ms/step; read {res['read_mib_per_step']:.0f} MiB + write "
              f"{res['write_mib_per_step']:.0f} MiB per step; prefetch {res['prefetch']}")
        if best_read:
            print(f"  bandwidth: read {res['read_gbps']:.2f} GB/s ({100 * res['read_gbps'] / best_read:.0f}% of the "
                  f"sweep's best {best_read:.2f}), write {res['write_gbps']:.2f} GB/s "
                  f"({100 * res['write_gbps'] / best_write:.0f}% of {best_write:.2f})")
        if best_read:
            # The rule (14): the step is disk-bound where its bytes at the sweep's rates take
            # longer than the in-RAM step; then the target is 1.10x that time.
            disk_ms = (res["read_mib_per_step"] * 2**20 / (best_read * 1e6) +
                       res["write_mib_per_step"] * 2**20 / (best_write * 1e6))
            res["disk_ms_at_sweep_rates"] = round(disk_ms, 1)
            res["disk_bound"] = disk_ms > ram_ms
            print(f"  case: the step's bytes at the sweep's rates take {disk_ms:.0f} ms against {ram_ms:.0f} ms in RAM: "
                  + ("disk-bound (target 1.10x that time)" if disk_ms > ram_ms else "not disk-bound by the bytes alone"))
            window = update_window(args, budget, runs[0]["activations"]) if args.optimizer == "adamw" else None
            if window:
                # Only the forward's compute can overlap the window (the backward precedes the norm):
                # with this disk the step is at least the in-RAM step less the forward plus the
                # window's disk time (the forward's compute as the plan measured it).
                w_read, w_write, fwd_ms = window
                w_ms = w_read / (best_read * 1e6) + w_write / (best_write * 1e6)
                window_floor = ram_ms - fwd_ms + max(fwd_ms, w_ms)
                res.update(window_read_mib=round(w_read / 2**20, 1), window_write_mib=round(w_write / 2**20, 1),
                           window_disk_ms=round(w_ms, 1), forward_compute_ms=round(fwd_ms, 1),
                           window_floor_ms=round(window_floor, 1), ratio_to_window_floor=round(off_ms / window_floor, 3))
                print(f"  update window (plan): {w_read / 2**20:.0f} MiB read + {w_write / 2**20:.0f} MiB written after "
                      f"the norm, {w_ms:.0f} ms at the sweep's rates against {fwd_ms:.0f} ms of forward compute: the "
                      f"step's floor on this disk ~{window_floor:.0f} ms ({window_floor / ram_ms:.2f}x RAM); measured "
                      f"{off_ms / window_floor:.2f}x that floor")
        print(f"  memory: peak RSS {res['offload_peak_rss_mib']:.0f} MiB vs budget {budget >> 20} MiB "
              f"(+{res['offload_peak_rss_mib'] - (budget >> 20):.0f} MiB); engine peak {res['offload_peak_engine_mib']:.0f} MiB")
        print(json.dumps(res))


if __name__ == "__main__":
    main()
