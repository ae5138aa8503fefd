"""PyTorch peer of Stratum's training-step benchmark: one GPT-2 training step, timed.

What it does: builds GPT-2 (default: small, L12 C768 H12, vocab 50257, n_positions 1024) in plain
fp32 PyTorch with HF semantics (tools/torch_gpt2.py), random init from --seed, random tokens,
and times full steps (forward, backward, global-norm clip 1.0, AdamW with the decay/no-decay
groups) at --batch x --seq (default 4 x 256). --warmup-steps steps run first and are not timed.
Prints one JSON line:
  {"impl":"pytorch","ms_per_step_median":..,"tokens_per_s":..,"peak_rss_mib":..,
   "torch_version":..,"threads":..,"openblas_coretype":..,...}
--autocast runs each step under torch.autocast("cpu", torch.bfloat16) (PyTorch's CPU mixed
precision: bf16 products, fp32 weights and optimizer), the peer of `stratum train --precision bf16`.
What it does not do: data loading from disk, compile, multi-process.

Environment: run it with OPENBLAS_CORETYPE *unset* (the caller unsets it), so OpenBLAS picks
its kernels for this CPU on its own; the value seen is reported as "openblas_coretype" (null
when unset) and a warning goes to stderr if it is set. Run with Debian's PyTorch:
  env -u OPENBLAS_CORETYPE /usr/bin/python3 bench/pytorch_train_step.py --threads 2
Small smoke config:
  env -u OPENBLAS_CORETYPE /usr/bin/python3 bench/pytorch_train_step.py --layers 2 --embd 128 \
      --heads 4 --steps 2
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch GPT-2 training-step benchmark")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup-steps", type=int, default=1, help="untimed steps run first")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--autocast", action="store_true",
                    help="run each step under torch.autocast('cpu', torch.bfloat16): PyTorch's bf16 mixed precision")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup_steps < 0 or a.threads < 1:
        ap.error("need --steps >= 1, --warmup-steps >= 0, --threads >= 1")
    if a.seq > a.positions:
        ap.error(f"--seq {a.seq} exceeds --positions {a.positions}")
    return a


def main():
    a = parse_args()
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    if coretype is not None:
        print(f"[bench] warning: OPENBLAS_CORETYPE={coretype} is set; the peer run expects it "
              "unset", file=sys.stderr)
    # OpenBLAS (Debian's torch BLAS) reads its thread count at load time.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))

    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import torch_gpt2 as tg

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = tg.GPT2Config(n_layer=a.layers, n_head=a.heads, n_embd=a.embd,
                        n_positions=a.positions, vocab_size=a.vocab)
    params = tg.init_params(cfg, ln_noise=False, bias_std=0.0)
    for t in params.values():
        t.requires_grad_(True)
    n_params = sum(t.numel() for t in params.values())
    total = a.warmup_steps + a.steps
    B, T = a.batch, a.seq
    tokens = torch.randint(0, a.vocab, (total * B * T + 1,), dtype=torch.int64)
    opt = tg.make_optimizer(params, a.lr, 0.9, 0.95, 1e-8, 0.1)

    times_ms, losses = [], []
    for s in range(total):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
            loss, _ = tg.train_step(params, cfg, opt, tokens, s, B, T, a.lr, a.clip)
        dt_ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss)
        if s >= a.warmup_steps:
            times_ms.append(dt_ms)
        print(f"[bench] step {s} {'warmup' if s < a.warmup_steps else 'timed'} "
              f"{dt_ms:.1f} ms loss {loss:.4f}", file=sys.stderr)

    med = statistics.median(times_ms)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    print(json.dumps({
        "impl": "pytorch",
        "ms_per_step_median": round(med, 3),
        "tokens_per_s": round(B * T / (med / 1e3), 3),
        "peak_rss_mib": round(peak_rss_mib, 1),
        "torch_version": torch.__version__,
        "threads": a.threads,
        "openblas_coretype": coretype,
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "ms_per_step_all": [round(x, 3) for x in times_ms],
        "config": {"n_layer": a.layers, "n_embd": a.embd, "n_head": a.heads,
                   "vocab_size": a.vocab, "n_positions": a.positions, "batch": B, "seq": T,
                   "n_params": n_params, "clip": a.clip,
                   "dtype": "bfloat16 autocast" if a.autocast else "float32"},
        "steps": a.steps,
        "warmup_steps": a.warmup_steps,
        "final_loss": losses[-1],
    }))


if __name__ == "__main__":
    main()
