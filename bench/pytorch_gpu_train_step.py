"""PyTorch peer of `stratum train --backend cuda`: GPT-2 training steps on one GPU, timed.

What it does: Hugging Face transformers' GPT2LMHeadModel (default: small, L12 C768 H12, vocab
50257), random init from --seed, in fp32 with TF32 off (as Stratum's exact mode), eager mode (no
torch.compile), attention by --attn (sdpa: PyTorch's fused kernels, transformers' default; eager:
the plain matmul-softmax-matmul), random tokens; each step is forward, backward, global-norm clip
1.0 and torch.optim.AdamW (decay on matrices, none on biases and norms), timed with
torch.cuda.synchronize. --warmup-steps run first and are not timed. Prints one JSON line
{"impl":"pytorch-cuda","ms_per_step_median":..,"tokens_per_s":..,"gpu":..,...}.
What it does not do: data loading, mixed precision, compile, multi-GPU.
Needs torch with CUDA and transformers (the project's GPU machine has both):
  python3 bench/pytorch_gpu_train_step.py --batch 4 --seq 1024 --steps 10
"""

import argparse
import json
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description="PyTorch GPT-2 training step on the GPU")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(a.seed)
    cfg = GPT2Config(n_layer=a.layers, n_head=a.heads, n_embd=a.embd, n_positions=a.positions,
                     vocab_size=a.vocab, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    try:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=a.attn)
    except TypeError:  # older transformers: the choice lives on the config
        cfg._attn_implementation = a.attn
        model = AutoModelForCausalLM.from_config(cfg)
    model = model.cuda().float().train()
    assert isinstance(model, GPT2LMHeadModel)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    B, T = a.batch, a.seq
    times, losses = [], []
    for s in range(a.warmup_steps + a.steps):
        x = torch.randint(0, a.vocab, (B, T), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss  # HF shifts the labels: next-token loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) * 1e3
        losses.append(float(loss))
        if s >= a.warmup_steps:
            times.append(dt)
    med = statistics.median(times)
    print(json.dumps({
        "impl": "pytorch-cuda", "attn": a.attn,
        "ms_per_step_median": round(med, 3), "tokens_per_s": round(B * T / (med / 1e3), 1),
        "gpu": torch.cuda.get_device_name(), "torch_version": torch.__version__,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
        "config": {"n_layer": a.layers, "n_embd": a.embd, "n_head": a.heads, "vocab_size": a.vocab,
                   "batch": B, "seq": T, "dtype": "float32", "tf32": False},
        "ms_per_step_all": [round(t, 2) for t in times], "final_loss": losses[-1],
    }))


if __name__ == "__main__":
    main()
