#!/usr/bin/env python3
"""Generation benchmark: a random-weight Llama decoded in RAM and under a memory budget, in the same run.

Per --dtype it writes the model with tools/make_random_llama.py into DIR/model-<dtype> (reused when
config and file sizes match): fp32, or bf16, which Stratum keeps in bf16 (Note [bf16 weights]);
bf16w runs the bf16 model with --fp32-weights (widened to fp32 on load, as before bf16 was kept) as
the baseline in the same run. Then
for each --batch runs `stratum generate` greedily (--temperature 0 --no-stop) on B random prompts
of --prompt-len ids (fixed seed; batch 1 takes the first line) in RAM and with --mem-budget =
--budget-frac of the weights' bytes as Stratum holds them (4 x params, 2 x params for bf16)
streaming from DIR/offload. A budget below
Stratum's minimum runs at the minimum it names (and says so).
Per run it reports decode tokens/s, prompt tokens/s, MiB read per step, peak RSS (/usr/bin/time) and a
bound from bandwidths measured in this run: in RAM, the step time if every weight but the input
embedding (only row-gathered) came from DRAM at build/mem_bandwidth's best rate; under a budget,
the step's read bytes at io_sweep's best O_DIRECT read rate on DIR. ratio = bound / actual step
time (1.0 = at the bandwidth limit; budget target >= 0.8). Also batch-B / batch-1 tokens/s under
the same budget (target >= 20 for B=32), and checks that greedy ids are identical between RAM and
budget runs of the same batch (exits 1 on a mismatch) and that batch 1 matches row 0 of batch B.
Steps: the prompt is fed in ceil(prompt_len / max(1, max(256, B) // B)) steps whose last one
already samples the first token, so a run has prompt_steps + tokens - 1 steps and read MiB per step
= read MiB / that (it includes any KV cache read back after a spill); the decode rate is Stratum's
"generated" rate, which counts the B x (tokens - 1) tokens sampled by decode steps over their time.
The machines are noisy (memory reads 30-50 GB/s, the disk 0.9-1.5 GB/s from minute to minute), so
each bound uses the faster of two measurements taken just before and just after its run, and
every run is repeated --rounds times (interleaved); the table gives medians (ratio also min-max).
Prints the machine, per-run lines, a markdown table and one JSON line.

Usage: /usr/bin/python3 bench/generate_bench.py --dir /path/on/disk [--preset 1b] [--dtype fp32,bf16]
           [--tokens 8] [--batch 1,32] [--budget-frac 0.25] [--prompt-len 16] [--threads 2]
           [--no-sweep --read-gbps X] [--mem-gbps X] [--sweep-mib 512] [--prefetch K] [--rounds 3]
Needs a Release build in build/ (stratum, io_sweep, mem_bandwidth).
"""
import argparse, json, math, os, random, re, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATUM = os.path.join(ROOT, "build", "stratum")
SWEEP = os.path.join(ROOT, "build", "io_sweep")
MEMBW = os.path.join(ROOT, "build", "mem_bandwidth")
TIME = "/usr/bin/time"  # GNU time, for the peak RSS of one command
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_random_llama as mrl  # noqa: E402

MAX_ROWS = 256  # Decoder::kMaxRows: rows (B x tokens) one step computes at most
HELD_BYTES = {"fp32": 4, "bf16": 2, "bf16w": 4}  # bytes per weight as Stratum holds them, per --dtype


def file_dtype(dtype):
    """The model file a --dtype runs: bf16w is the bf16 file widened on load."""
    return "bf16" if dtype == "bf16w" else dtype
MIB = 1 << 20


def ensure_model(args, dtype):
    cfg = mrl.make_config(args.preset, dtype)
    out = os.path.join(args.dir, f"model-{dtype}")
    if mrl.model_complete(out, cfg, dtype):
        print(f"model {out}: reused")
    else:
        t0 = time.time()
        mrl.write_model(out, cfg, dtype, seed=args.seed, threads=args.threads)
        print(f"model {out}: written in {time.time() - t0:.1f} s")
    return out, cfg


def write_prompts(path, batch, prompt_len, vocab, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(batch):
            f.write(",".join(str(rng.randrange(3, vocab)) for _ in range(prompt_len)) + "\n")


def run(cmd):
    """Runs cmd; returns (returncode, stdout, stderr, peak RSS MiB of cmd alone). The RSS comes from
    /usr/bin/time: a child forked from Python starts with Python's high-water mark, which wait4's
    ru_maxrss keeps across exec, so small runs would all read as Python's size."""
    with tempfile.NamedTemporaryFile("r") as rss:
        timed = [TIME, "-f", "%M", "-o", rss.name] + cmd if os.path.exists(TIME) else cmd
        p = subprocess.run(timed, capture_output=True, text=True)
        kib = rss.read().strip().splitlines()
        peak = float(kib[-1]) / 1024.0 if kib and kib[-1].isdigit() else float("nan")
    return p.returncode, p.stdout, p.stderr, peak


def mem_bandwidth(threads):
    rc, out, err, _ = run([MEMBW, "--threads", str(threads)])
    if rc != 0:
        sys.exit(f"generate_bench: {MEMBW} failed (build it: cmake --build build --target mem_bandwidth):\n{err}")
    return json.loads(out.strip().splitlines()[-1])["read_gbps_best"]


def sweep_best_read(directory, file_mib):
    rc, out, err, _ = run([SWEEP, "--dir", directory, "--file-mib", str(file_mib), "--blocks", "1M,4M",
                           "--depths", "8,16"])
    if rc != 0:
        sys.exit(f"generate_bench: io_sweep failed:\n{err}")
    if "O_DIRECT refused" in out:
        print("warning: io_sweep could not use O_DIRECT on --dir: its read rate is a page-cache rate")
    return float(re.search(r"best read:.*?([0-9.]+) GB/s", out).group(1))


def generate(args, model, prompts, batch, budget_bytes, widen=False):
    """One `stratum generate` run; budget_bytes 0 = in RAM; widen: --fp32-weights. Returns a dict of
    what it printed, or {"below_minimum_bytes": n} when Stratum refuses the budget."""
    cmd = [STRATUM, "generate", "--model", model, "--prompt-ids-file", prompts, "--batch", str(batch),
           "--max-tokens", str(args.tokens), "--temperature", "0", "--no-stop", "--threads", str(args.threads),
           "--output-ids"] + (["--fp32-weights"] if widen else [])
    if budget_bytes:
        cmd += ["--mem-budget", f"{budget_bytes >> 10}K", "--offload-dir", os.path.join(args.dir, "offload")]
        if args.prefetch is not None:
            cmd += ["--prefetch", str(args.prefetch)]
    rc, out, err, rss = run(cmd)
    if rc != 0:
        floor = re.search(r"is below the minimum of .*use --mem-budget (\d+)([KMG])", err)
        if budget_bytes and floor:
            return {"below_minimum_bytes": int(floor.group(1)) << {"K": 10, "M": 20, "G": 30}[floor.group(2)]}
        sys.exit(f"generate_bench: {' '.join(cmd)} failed:\n{err}")
    speed = re.search(r"prompt: (\d+) tokens at ([0-9.]+) tokens/s; generated: (\d+) tokens at ([0-9.]+) tokens/s", err)
    if not speed:
        sys.exit(f"generate_bench: no '[stratum] prompt: ...' line from {' '.join(cmd)}:\n{err}")
    streamed = re.search(r"([0-9.]+) MiB read, peak RAM ([0-9.]+) MiB of the ([0-9.]+) MiB budget", err)
    spilled = re.search(r"KV cache spilled: ([0-9.]+) MiB written", err)
    if budget_bytes and not streamed:
        sys.exit(f"generate_bench: no '[stratum] weights streamed ...' line from {' '.join(cmd)}:\n{err}")
    ids = [json.loads(line)["ids"] for line in out.splitlines() if line.startswith("{")]
    return {"prompt_tokens": int(speed.group(1)), "prompt_tps": float(speed.group(2)),
            "generated_tokens": int(speed.group(3)), "stratum_generate_tps": float(speed.group(4)),
            "read_mib": float(streamed.group(1)) if streamed else 0.0,
            "engine_peak_mib": float(streamed.group(2)) if streamed else None, "peak_rss_mib": round(rss, 1),
            "kv_spilled_mib": float(spilled.group(1)) if spilled else 0.0,
            "ids": ids}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="models, offload dir and io_sweep file go here (the disk to measure)")
    p.add_argument("--preset", choices=sorted(mrl.PRESETS), default="1b")
    p.add_argument("--dtype", default="fp32,bf16,bf16w",
                   help="comma-separated: fp32, bf16 (kept bf16), bf16w (the bf16 file widened: --fp32-weights)")
    p.add_argument("--tokens", type=int, default=8, help="tokens generated per sequence (>= 2)")
    p.add_argument("--batch", default="1,32", help="comma-separated batch sizes; the first is the baseline")
    p.add_argument("--budget-frac", type=float, default=0.25, help="of the weights' bytes as held (per dtype)")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=None, help="default: stratum's (2)")
    p.add_argument("--seed", type=int, default=1234, help="model weights and prompts")
    p.add_argument("--no-sweep", action="store_true", help="skip io_sweep; use --read-gbps")
    p.add_argument("--read-gbps", type=float, default=0.0, help="disk read GB/s with --no-sweep")
    p.add_argument("--sweep-mib", type=int, default=512, help="io_sweep file size")
    p.add_argument("--mem-gbps", type=float, default=0.0, help="skip mem_bandwidth and use this GB/s")
    p.add_argument("--rounds", type=int, default=3, help="every run this many times, interleaved; medians reported")
    args = p.parse_args()
    dtypes = args.dtype.split(",")
    batches = [int(b) for b in args.batch.split(",")]
    if args.tokens < 2 or any(d not in HELD_BYTES for d in dtypes) or min(batches) < 1:
        sys.exit("generate_bench: --tokens must be >= 2, --dtype in fp32,bf16,bf16w and batches >= 1")
    os.makedirs(os.path.join(args.dir, "offload"), exist_ok=True)

    files = {f: ensure_model(args, f) for f in sorted({file_dtype(d) for d in dtypes})}
    models = {d: files[file_dtype(d)] for d in dtypes}
    cfg = models[dtypes[0]][1]
    params = mrl.param_count(cfg)
    C, V = cfg["hidden_size"], cfg["vocab_size"]
    # Bytes as Stratum holds them (RAM and offload dir): the budget's base and the RAM bound's bytes.
    weight_bytes = {d: HELD_BYTES[d] * params for d in dtypes}
    streamed_bytes = {d: HELD_BYTES[d] * (params - (0 if cfg["tie_word_embeddings"] else V * C))
                      for d in dtypes}  # all but the gathered embedding
    budget_of = {d: max(1, int(args.budget_frac * weight_bytes[d]) // MIB) * MIB for d in dtypes}
    print(f"machine: {os.cpu_count()} CPUs, load {open('/proc/loadavg').read().split()[:3]}; bounds from "
          f"mem_bandwidth ({args.threads} threads) and io_sweep's best O_DIRECT read on {args.dir}, measured just "
          f"before and after each run")
    print(f"model {args.preset}: {params / 1e6:.1f}M params; budgets "
          + ", ".join(f"{d} {budget_of[d] / MIB:.0f} MiB of {weight_bytes[d] / MIB:.0f}" for d in dtypes)
          + f" ({args.budget_frac:g}); prompt {args.prompt_len} ids, {args.tokens} tokens, {args.threads} threads")

    def bandwidth(mode):
        """GB/s the bound uses, measured now: memory for RAM runs, the disk for budget runs."""
        if mode == "RAM":
            return args.mem_gbps or mem_bandwidth(args.threads)
        return args.read_gbps if args.no_sweep else sweep_best_read(args.dir, args.sweep_mib)

    rows, failed, raw = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        prompt_files = {}
        for b in batches:
            prompt_files[b] = os.path.join(tmp, f"prompts-{b}.txt")
            write_prompts(prompt_files[b], b, args.prompt_len, V, args.seed)  # same seed: batch 1 = line 1
        budgets = {}  # (dtype, batch) -> budget actually run
        for rnd in range(args.rounds):
            for dtype in dtypes:
                model = models[dtype][0]
                for b in batches:
                    prompt_steps = math.ceil(args.prompt_len / max(1, max(MAX_ROWS, b) // b))
                    steps = prompt_steps + args.tokens - 1
                    for mode in ("RAM", "budget"):
                        run_budget = budgets.get((dtype, b), budget_of[dtype]) if mode == "budget" else 0
                        before = bandwidth(mode)
                        r = generate(args, model, prompt_files[b], b, run_budget, dtype == "bf16w")
                        if "below_minimum_bytes" in r:
                            run_budget = budgets[(dtype, b)] = r["below_minimum_bytes"]
                            print(f"{dtype} batch {b}: budget {budget_of[dtype] / MIB:.0f} MiB is below the minimum: "
                                  f"running at the minimum, {run_budget / MIB:.1f} MiB")
                            r = generate(args, model, prompt_files[b], b, run_budget, dtype == "bf16w")
                        # The bound uses the faster of the measurements just before and just after.
                        gbps = max(before, bandwidth(mode))
                        step_s = b / r["stratum_generate_tps"] if r["stratum_generate_tps"] > 0 else float("inf")
                        read_per_step = r["read_mib"] * MIB / steps
                        bound_s = (read_per_step if mode == "budget" else streamed_bytes[dtype]) / (gbps * 1e9)
                        r.update({"round": rnd + 1, "dtype": dtype, "batch": b, "mode": mode,
                                  "budget_mib": round(run_budget / MIB, 1), "bound_gbps": gbps,
                                  "decode_tps": r["stratum_generate_tps"], "step_ms": 1e3 * step_s,
                                  "prompt_steps": prompt_steps, "steps": steps, "read_mib_per_step": read_per_step / MIB,
                                  "bound": "disk" if mode == "budget" else "mem", "bound_ms": 1e3 * bound_s,
                                  "ratio": bound_s / step_s})
                        raw.append(r)
                        print(f"round {rnd + 1} {dtype} batch {b} {mode}: {r['decode_tps']:.3g} tok/s, bound/actual "
                              f"{r['ratio']:.2f} at {gbps:.2f} GB/s", flush=True)
        for dtype in dtypes:
            for b in batches:
                ram, off = [[r for r in raw if (r["dtype"], r["batch"], r["mode"]) == (dtype, b, m)] for m in ("RAM", "budget")]
                same = all(r["ids"] == ram[0]["ids"] for r in ram + off)
                print(f"{dtype} batch {b}: greedy ids of every RAM and budget run: {'OK' if same else 'MISMATCH'}")
                if not same:
                    failed.append(f"{dtype} batch {b} RAM vs budget")
            first = next(r for r in raw if (r["dtype"], r["batch"], r["mode"]) == (dtype, batches[0], "RAM"))
            for b in batches[1:]:
                other = next(r for r in raw if (r["dtype"], r["batch"], r["mode"]) == (dtype, b, "RAM"))
                n = min(len(first["ids"]), len(other["ids"]))
                same = first["ids"][:n] == other["ids"][:n]
                print(f"{dtype}: greedy ids batch {batches[0]} vs the same prompts in batch {b}: "
                      f"{'OK' if same else 'MISMATCH'}")
                if not same:
                    failed.append(f"{dtype} batch {batches[0]} vs batch {b}")
        if "bf16" in dtypes and "bf16w" in dtypes:  # Note [bf16 weights]: kept and widened give the same ids
            for b in batches:
                kept, wide = [[r["ids"] for r in raw if (r["dtype"], r["batch"]) == (d, b)] for d in ("bf16", "bf16w")]
                same = all(ids == wide[0] for ids in kept + wide)
                print(f"bf16 kept vs widened, batch {b}: greedy ids {'OK' if same else 'MISMATCH'}")
                if not same:
                    failed.append(f"bf16 vs bf16w batch {b}")
        # One row per configuration: medians over the rounds (ratio also min..max).
        for dtype in dtypes:
            for b in batches:
                for mode in ("RAM", "budget"):
                    runs = [r for r in raw if (r["dtype"], r["batch"], r["mode"]) == (dtype, b, mode)]
                    med = lambda key: statistics.median(r[key] for r in runs)
                    rows.append({"dtype": dtype, "batch": b, "mode": mode, "budget_mib": runs[0]["budget_mib"],
                                 "rounds": len(runs), "decode_tps": med("decode_tps"), "prompt_tps": med("prompt_tps"),
                                 "step_ms": med("step_ms"), "read_mib_per_step": med("read_mib_per_step"),
                                 "bound": runs[0]["bound"], "bound_gbps": med("bound_gbps"), "bound_ms": med("bound_ms"),
                                 "ratio": med("ratio"), "ratio_min": min(r["ratio"] for r in runs),
                                 "ratio_max": max(r["ratio"] for r in runs), "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                                 "kv_spilled_mib": med("kv_spilled_mib")})

    print()
    print(f"medians of {args.rounds} round(s); bound/actual = the bound's step time / the measured step time "
          "(1 = at the bandwidth limit)")
    print("| dtype | batch | mode | budget MiB | decode tok/s | prompt tok/s | step ms | MiB read/step | bound ms (GB/s) | "
          "bound/actual (min-max) | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['batch']} | {r['mode']} | {r['budget_mib'] or '-'} | {r['decode_tps']:.3g} | "
              f"{r['prompt_tps']:.3g} | {r['step_ms']:.0f} | {r['read_mib_per_step']:.0f} | {r['bound_ms']:.0f} "
              f"({r['bound']} {r['bound_gbps']:.2f}) | {r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | "
              f"{r['peak_rss_mib']:.0f} |")
    scaling = []
    for dtype in dtypes:
        for mode in ("RAM", "budget"):
            base = next(r for r in rows if (r["dtype"], r["batch"], r["mode"]) == (dtype, batches[0], mode))
            for b in batches[1:]:
                r = next(r for r in rows if (r["dtype"], r["batch"], r["mode"]) == (dtype, b, mode))
                x = r["decode_tps"] / base["decode_tps"]
                scaling.append({"dtype": dtype, "mode": mode, "batch": b, "vs_batch": batches[0],
                                "tps_ratio": round(x, 2)})
                target = " (target >= 20)" if mode == "budget" and b == 32 and batches[0] == 1 else ""
                print(f"{dtype} {mode}: batch {b} / batch {batches[0]} decode tokens/s = {x:.2f}{target}")
    print(json.dumps({
        "bench": "generate", "preset": args.preset, "params": params,
        "weight_mib": {d: round(weight_bytes[d] / MIB, 1) for d in dtypes},
        "budget_frac": args.budget_frac, "budget_mib": {d: budget_of[d] // MIB for d in dtypes}, "tokens": args.tokens,
        "prompt_len": args.prompt_len, "threads": args.threads, "rounds": args.rounds,
        "cpus": os.cpu_count(), "configs": rows, "runs": [{k: v for k, v in r.items() if k != "ids"} for r in raw],
        "batch_scaling": scaling, "ids_check": "MISMATCH: " + "; ".join(failed) if failed else "OK"}))
    if failed:
        sys.exit(f"generate_bench: greedy ids differ: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
