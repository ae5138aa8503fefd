"""PyTorch peer of Stratum's LoRA benchmark (bench/lora_bench.py): the same hand-written LoRA
(tools/torch_lora.py's PEFT semantics) over a frozen Llama, one training step timed.

What it does: loads a Hugging Face Llama directory (e.g. tools/make_random_llama.py --preset 1b;
weights widened to fp32, as Stratum holds them), adds LoRA adapters of rank --lora-r (alpha 2r)
on --targets, and times steps at --batch x --seq on random tokens: forward (tools/torch_llama.py,
eager fp32), backward into the adapters only, global-norm clip 1.0, AdamW on the adapters.
--warmup-steps run first untimed. --bf16: the frozen base kept bf16 as stored and the step run
under torch.autocast("cpu", torch.bfloat16) (PyTorch's peer of `stratum train --precision bf16`;
the adapters and AdamW stay fp32). Prints one JSON line:
  {"impl":"pytorch-lora","ms_per_step_median":..,"tokens_per_s":..,"peak_rss_mib":..,...}
What it does not do: PEFT itself (not in Debian), compile, data loading.
Run with Debian's PyTorch and OPENBLAS_CORETYPE unset:
  env -u OPENBLAS_CORETYPE /usr/bin/python3 bench/pytorch_lora_step.py --model /tmp/llama1b --threads 2
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))


def main():
    ap = argparse.ArgumentParser(description="PyTorch hand-written LoRA training-step benchmark")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    ap.add_argument("--bf16", action="store_true", help="base kept bf16, autocast to bf16 (see above)")
    a = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    import torch
    import torch_gpt2 as tg
    import torch_llama as tl
    import torch_lora
    torch.set_num_threads(a.threads)

    with open(os.path.join(a.model, "config.json")) as f:
        hf = json.load(f)
    keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "max_position_embeddings", "vocab_size", "rms_norm_eps", "rope_theta", "rope_scaling",
            "tie_word_embeddings"]
    cfg = tl.LlamaConfig(**{k: hf[k] for k in keys if k in hf})
    base = {}
    for name in sorted(os.listdir(a.model)):
        if name.endswith(".safetensors"):
            tensors, _ = tg.load_safetensors(os.path.join(a.model, name))
            base.update({n: t.to(torch.bfloat16 if a.bf16 else torch.float32) for n, t in tensors.items()})
    gen = torch.Generator().manual_seed(7)
    if a.bf16:  # norms in fp32, as autocast computes them (and as Stratum keeps them)
        base = {n: (t.to(torch.float32) if t.dim() == 1 else t) for n, t in base.items()}
    adapters = torch_lora.adapters_make(base, "model.layers.", cfg.num_hidden_layers, torch_lora.LLAMA_MODULES,
                                        a.targets.split(","), a.lora_r, gen, False)
    adapters = {n: (x.requires_grad_(True), y.requires_grad_(True)) for n, (x, y) in adapters.items()}
    params = {n + k: t for n, (x, y) in adapters.items() for k, t in ((".A", x), (".B", y))}
    opt = tg.make_optimizer(params, 1e-4, 0.9, 0.95, 1e-8, 0.1)
    hook = torch_lora.adapter_fn(adapters, 2.0)  # alpha / r with alpha = 2r, as bench/lora_bench.py
    times = []
    for step in range(a.warmup_steps + a.steps):
        x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=gen)
        y = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=gen)
        t0 = time.perf_counter()
        for t in params.values():
            t.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            _, loss = tl.forward(base, cfg, x, y, adapter=hook)
        loss.backward()
        tg.grad_norm_and_clip(params, 1.0)
        opt.step()
        if step >= a.warmup_steps:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    print(json.dumps({"impl": "pytorch-lora" + ("-bf16-autocast" if a.bf16 else ""), "ms_per_step_median": round(ms, 1),
                      "tokens_per_s": round(a.batch * a.seq / ms * 1e3, 2),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
                      "torch_version": torch.__version__, "threads": a.threads, "batch": a.batch, "seq": a.seq,
                      "lora_r": a.lora_r, "targets": a.targets, "trainable": sum(t.numel() for t in params.values())}))


if __name__ == "__main__":
    main()
