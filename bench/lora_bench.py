#!/usr/bin/env python3
"""LoRA benchmark: one Hugging Face model fine-tuned with LoRA adapters in RAM and under memory
budgets, in the same run, plus a full fine-tune of the same model for comparison.

Default: the model in --model (e.g. the ~1.1B Llama of tools/make_random_llama.py --preset 1b),
B=4, T=256, LoRA r=16 alpha=32 on q,k,v,o. Budgets are fractions of the base's bytes as the
engine holds them (a bf16 checkpoint's layers at 2 bytes, the rest fp32); a fraction below the
run's minimum budget runs at the minimum (and says so). Per configuration: median step time (first step excluded), the ratio
to LoRA in RAM, tokens/s, stall per step, bytes read/written per step, peak RSS against the
budget, the plan's prediction and the params hash (the same in every LoRA configuration).
--full-budget SIZE adds a full fine-tune (AdamW on every weight) under that budget (in RAM when
0), for tokens/s and peak RSS against LoRA's. Prints a table and a JSON line.

Usage: python3 bench/lora_bench.py --model /tmp/llama1b --data tokens.bin --dir /path/on/nvme
           [--steps 3] [--budget-frac 0.25,0.10] [--lora-r 16] [--targets q_proj,k_proj,v_proj,o_proj]
           [--full-budget 6G] [--threads 2] [--precision fp32|bf16]
Needs a Release build in build/ (stratum).
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATUM = os.path.join(ROOT, "build", "stratum")


def mib_of(text, label):
    m = re.search(label + r" ([0-9.]+) (KiB|MiB|GiB)", text)
    return float(m.group(1)) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[m.group(2)]


def run_train(args, budget, lora, log):
    cmd = [STRATUM, "train", "--model", args.model, "--data", args.data, "--batch", str(args.batch), "--seq",
           str(args.seq), "--steps", str(args.steps), "--threads", str(args.threads), "--quiet", "--lr", "1e-4",
           "--lr-schedule", "constant", "--log", log, "--precision", args.precision]
    if lora:
        cmd += ["--lora-r", str(args.lora_r), "--lora-alpha", str(2 * args.lora_r), "--lora-targets", args.targets]
    if budget:
        cmd += ["--mem-budget", str(budget), "--offload-dir", args.dir]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"lora_bench: {' '.join(cmd)} failed:\n{r.stderr}")
    steps = [json.loads(line) for line in open(log)]
    steps = steps[1:] if len(steps) > 1 else steps
    ms = statistics.median(s["step_ms"] for s in steps)
    grab = lambda pat, cast=float: cast(m.group(1)) if (m := re.search(pat, r.stderr)) else None
    return {"budget_mib": budget / 2**20, "lora": lora, "step_ms": ms, "tokens_per_s": args.batch * args.seq / ms * 1e3,
            "stall_ms": statistics.median(s.get("stall_ms", 0.0) for s in steps),
            "read_mib": statistics.median(s.get("read_bytes", 0) for s in steps) / 2**20,
            "write_mib": statistics.median(s.get("write_bytes", 0) for s in steps) / 2**20,
            "rss_mib": grab(r"peak RSS ([0-9.]+) MiB"), "predicted_ms": grab(r"predicted step ([0-9.]+) ms"),
            "hash": grab(r"params hash ([0-9a-f]+)", str)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="a token file within the model's vocabulary")
    p.add_argument("--dir", required=True, help="offload directory (on the disk to measure)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    p.add_argument("--budget-frac", default="0.25,0.10", help="fractions of the base's bytes as held")
    p.add_argument("--full-budget", default=None, help="also a full fine-tune under this budget (0 = in RAM)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="the runs' --precision")
    args = p.parse_args()

    plan = subprocess.run([STRATUM, "plan", "--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq),
                           "--lora-r", str(args.lora_r), "--lora-alpha", str(2 * args.lora_r), "--lora-targets",
                           args.targets, "--precision", args.precision], capture_output=True, text=True)
    if plan.returncode != 0:
        sys.exit(f"lora_bench: stratum plan failed:\n{plan.stderr}")
    base_mib = mib_of(plan.stdout, "params")
    min_mib = mib_of(plan.stdout, "minimum budget")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        runs.append(run_train(args, 0, True, log))
        for frac in [float(f) for f in args.budget_frac.split(",")]:
            mib = max(frac * base_mib, min_mib + 1)
            r = run_train(args, int(mib * 2**20), True, log)
            r["frac"] = frac
            r["at_minimum"] = frac * base_mib < min_mib + 1
            runs.append(r)
        if args.full_budget is not None:
            size = args.full_budget
            mult = {"G": 30, "M": 20}.get(size[-1:].upper(), 0)
            budget = int(float(size[:-1]) * (1 << mult)) if mult else int(size)
            runs.append(run_train(args, budget, False, log))
    ram = runs[0]["step_ms"]
    print(f"LoRA r={args.lora_r} on {args.targets}, {args.model}: base {base_mib:.0f} MiB (as held), minimum budget "
          f"{min_mib:.0f} MiB; B={args.batch} T={args.seq}, {args.threads} threads, --precision {args.precision}")
    print(f"{'config':34} {'step ms':>9} {'x RAM':>6} {'tok/s':>7} {'stall':>7} {'read MiB':>9} {'write MiB':>9} "
          f"{'RSS MiB':>8} {'plan ms':>8}  hash")
    for r in runs:
        name = ("LoRA " if r["lora"] else "full fine-tune ") + (
            f"budget {r['budget_mib']:.0f}M" + (f" ({r['frac']:.0%}{', minimum' if r.get('at_minimum') else ''})"
                                             if "frac" in r else "") if r["budget_mib"] else "in RAM")
        print(f"{name:34} {r['step_ms']:9.0f} {r['step_ms'] / ram:6.2f} {r['tokens_per_s']:7.1f} {r['stall_ms']:7.0f} "
              f"{r['read_mib']:9.0f} {r['write_mib']:9.0f} {r['rss_mib'] or 0:8.0f} {r['predicted_ms'] or 0:8.0f}  "
              f"{r['hash']}")
    lora_hashes = {r["hash"] for r in runs if r["lora"]}
    print("same bits in every LoRA configuration" if len(lora_hashes) == 1 else f"HASHES DIFFER: {lora_hashes}")
    print(json.dumps({"bench": "lora", "base_mib": base_mib, "min_budget_mib": min_mib, "runs": runs}))


if __name__ == "__main__":
    main()
