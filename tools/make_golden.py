"""Regenerates Stratum's PyTorch golden files, deterministically.

What it does: writes tests/golden/tiny_gpt2/ (a tiny GPT-2 in HF layout, its first-batch logits,
loss and gradients, and a 20-step AdamW training run) and tests/golden/ops/ (per-kernel forward
and backward references computed in float64, stored as F32). See tools/README.md for the exact
semantics and file contents.
What it does not do: anything with real GPT-2 weights or a tokenizer.

Run: /usr/bin/python3 tools/make_golden.py [--out tests/golden] [--only autocast]
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2 as tg  # noqa: E402
import torch_lora  # noqa: E402
import torch_zo  # noqa: E402

SEED = 1234
TOKENS_SEED = 4321

TINY = dict(n_layer=2, n_head=4, n_embd=32, n_positions=64, vocab_size=101,
            layer_norm_epsilon=1e-5)
TRAIN = dict(batch=4, seq=32, steps=20, lr=1e-3, lr_schedule="cosine", warmup=5, min_lr=1e-4,
             beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
# Second run covering what TRAIN does not reach: its grad norms stay below 1.0 (clipping never
# scales), its loader never wraps and its schedule is cosine. This one clips at 0.5 (every step
# scales), runs 24 steps over the same 20*B*T+1 tokens (batches 20..23 wrap) and uses the
# constant schedule.
TRAIN_CLIP = dict(TRAIN, steps=24, lr_schedule="constant", warmup=3, grad_clip=0.5)


# Zeroth-order SGD (MeZO) from the same model and tokens: what `stratum train --optimizer zo-sgd`
# is checked against (tools/torch_zo.py reproduces its z generator). seed is Stratum's default.
ZO = dict(batch=4, seq=32, steps=8, lr=1e-3, lr_schedule="cosine", warmup=2, min_lr=1e-4, zo_eps=1e-3,
          weight_decay=0.1, seed=1337)


def _f32(t):
    return t.detach().to(torch.float32).contiguous()


def _rand64(gen, *shape, scale=1.0):
    """Random normal values rounded to float32, held in float64 (so F32 inputs are exact)."""
    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(torch.float64)


# ----------------------------------------------------------------------------------------------
# tiny_gpt2

def train_run(cfg, init, tokens, a, autocast=False):
    """Trains a copy of `init` for a["steps"] steps; returns train_* arrays and final.<name>."""
    params = {n: t.detach().clone().requires_grad_(True) for n, t in init.items()}
    opt = tg.make_optimizer(params, a["lr"], a["beta1"], a["beta2"], a["eps"], a["weight_decay"])
    losses, norms, lrs = [], [], []
    for s in range(a["steps"]):
        lr = tg.lr_at(s, a["lr"], a["warmup"], a["min_lr"], a["steps"], a["lr_schedule"])
        loss_s, norm_s = tg.train_step(params, cfg, opt, tokens, s, a["batch"], a["seq"], lr,
                                       a["grad_clip"], autocast=autocast)
        losses.append(loss_s)
        norms.append(norm_s)
        lrs.append(lr)
    out = {"train_losses": torch.tensor(losses, dtype=torch.float32),
           "train_grad_norms": torch.tensor(norms, dtype=torch.float32),
           "train_lrs": torch.tensor(lrs, dtype=torch.float32)}
    for n, t in params.items():
        out["final." + n] = _f32(t)
    return out


def make_tiny(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    cfg = tg.GPT2Config(**TINY)
    torch.manual_seed(SEED)
    params = tg.init_params(cfg, generator=None, ln_noise=True)  # global RNG, seeded above

    tg.write_hf_config(os.path.join(out_dir, "config.json"), cfg)

    # Like HF save_pretrained: tied lm_head omitted; tensors sorted by name; format metadata.
    names_sorted = sorted(params)
    tg.save_safetensors(os.path.join(out_dir, "model.safetensors"),
                        {n: params[n] for n in names_sorted}, metadata={"format": "pt"})

    # Variant: no `transformer.` prefix, causal-mask buffers, explicit lm_head.weight.
    P = cfg.n_positions
    variant = {}
    for n in names_sorted:
        variant[n[len("transformer."):]] = params[n]
    for i in range(cfg.n_layer):
        variant[f"h.{i}.attn.bias"] = torch.ones(P, P).tril().reshape(1, 1, P, P)
    variant["lm_head.weight"] = params["transformer.wte.weight"].clone()
    tg.save_safetensors(os.path.join(out_dir, "model_with_buffers.safetensors"),
                        {n: variant[n] for n in sorted(variant)}, metadata={"format": "pt"})

    B, T, S = TRAIN["batch"], TRAIN["seq"], TRAIN["steps"]
    n_tokens = B * T * S + 1
    gen = torch.Generator().manual_seed(TOKENS_SEED)
    tokens = torch.randint(0, cfg.vocab_size, (n_tokens,), generator=gen, dtype=torch.int64)
    tokens.numpy().astype("<u2").tofile(os.path.join(out_dir, "tokens.bin"))

    with open(os.path.join(out_dir, "train_args.json"), "w") as f:
        json.dump(TRAIN, f, indent=2)
        f.write("\n")

    # First batch: logits, loss, gradients.
    for t in params.values():
        t.requires_grad_(True)
    x, y = tg.get_batch(tokens, 0, B, T)
    logits, loss = tg.forward(params, cfg, x, y)
    loss.backward()
    ref = {"logits": _f32(logits), "loss": _f32(loss.reshape(1))}
    for n, t in params.items():
        ref["grad." + n] = _f32(t.grad)

    init = {n: t.detach().clone() for n, t in params.items()}
    meta = {"generator": "tools/make_golden.py", "torch_version": torch.__version__,
            "seed": SEED, "tokens_seed": TOKENS_SEED}
    run = train_run(cfg, init, tokens, TRAIN)
    ref.update(run)
    tg.save_safetensors(os.path.join(out_dir, "reference.safetensors"), ref,
                        metadata=dict(meta, train_args=json.dumps(TRAIN)))
    losses = run["train_losses"].tolist()
    assert abs(losses[0] - float(loss)) < 1e-6, "bug: step-0 training loss != first-batch loss"

    run_clip = train_run(cfg, init, tokens, TRAIN_CLIP)
    tg.save_safetensors(os.path.join(out_dir, "reference_clip.safetensors"), run_clip,
                        metadata=dict(meta, train_args=json.dumps(TRAIN_CLIP)))
    with open(os.path.join(out_dir, "train_args_clip.json"), "w") as f:
        json.dump(TRAIN_CLIP, f, indent=2)
        f.write("\n")
    assert float(run_clip["train_grad_norms"].min()) > TRAIN_CLIP["grad_clip"], \
        "clip variant no longer clips every step; lower its grad_clip"
    return {"loss0": float(loss), "loss_last": losses[-1],
            "clip_norms": run_clip["train_grad_norms"].tolist(),
            "norm0": float(run["train_grad_norms"][0]),
            "n_params": sum(t.numel() for t in params.values())}


def make_autocast(out_dir):
    """reference_bf16.safetensors: the TRAIN run of the tiny GPT-2 with its forward under CPU
    autocast to bfloat16 (what `stratum train --precision bf16` is checked against), from the
    model.safetensors and tokens.bin already in out_dir, plus the same run in fp32 for scale."""
    cfg = tg.GPT2Config(**TINY)
    init, _ = tg.load_safetensors(os.path.join(out_dir, "model.safetensors"))
    init = {n: t.to(torch.float32) for n, t in init.items()}
    tokens = torch.from_numpy(np.fromfile(os.path.join(out_dir, "tokens.bin"), dtype="<u2").astype(np.int64))
    bf16 = train_run(cfg, init, tokens, TRAIN, autocast=True)
    fp32 = train_run(cfg, init, tokens, TRAIN)
    out = {"train_losses": bf16["train_losses"], "train_grad_norms": bf16["train_grad_norms"],
           "fp32_train_losses": fp32["train_losses"]}
    tg.save_safetensors(os.path.join(out_dir, "reference_bf16.safetensors"), out,
                        metadata={"generator": "tools/make_golden.py --only autocast",
                                  "torch_version": torch.__version__, "train_args": json.dumps(TRAIN)})
    diff = (bf16["train_losses"] - fp32["train_losses"]).abs().max().item()
    return {"bf16_loss_last": bf16["train_losses"][-1].item(), "max_bf16_fp32_loss_diff": diff}


# LoRA (tools/torch_lora.py): adapters on every block linear (c_attn, and c_proj matching both
# attn.c_proj and mlp.c_proj as PEFT matches), 8 AdamW steps of the adapters alone.
LORA_TRAIN = dict(batch=4, seq=32, steps=8, lr=1e-2, lr_schedule="cosine", warmup=2, min_lr=1e-3, beta1=0.9,
                  beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
LORA = dict(r=4, alpha=8.0, rslora=False, targets=["c_attn", "c_proj", "c_fc"], modules=torch_lora.GPT2_MODULES,
            layer_prefix="transformer.h.", n_layer=TINY["n_layer"], fan_in_fan_out=True, seed=SEED + 7)


# The same run with lora_dropout 0.1 (Stratum's mask, torch_lora.dropout_mask) under --seed 1337.
LORA_DROPOUT = dict(p=0.1, seed=1337)


def make_lora(out_dir):
    """lora_init/, reference_lora.safetensors and lora_args.json of the tiny GPT-2."""
    cfg = tg.GPT2Config(**TINY)
    base, _ = tg.load_safetensors(os.path.join(out_dir, "model.safetensors"))
    fwd = lambda p, x, y, ad: tg.forward(p, cfg, x, y, adapter=ad)[1]  # noqa: E731
    info = torch_lora.write_reference(out_dir, base, fwd, LORA_TRAIN, LORA, "tools/make_golden.py --only lora")
    torch_lora.write_zo_reference(out_dir, base, fwd, LORA, ZO, "tools/make_golden.py --only lora")
    info["dropout"] = torch_lora.write_reference(out_dir, base, fwd, LORA_TRAIN, LORA,
                                                 "tools/make_golden.py --only lora", dropout=LORA_DROPOUT)["losses"]
    return info


def make_zo(out_dir):
    """reference_zo.safetensors: ZO steps of the tiny GPT-2 from model.safetensors and tokens.bin."""
    cfg = tg.GPT2Config(**TINY)
    init, _ = tg.load_safetensors(os.path.join(out_dir, "model.safetensors"))
    return torch_zo.write_reference(out_dir, init, lambda p, x, y: tg.forward(p, cfg, x, y)[1], ZO,
                                    "tools/make_golden.py --only zo")


# Note [loss mask] (src/data/token_file.h): prompt tokens are no loss targets. MASKED: the tiny
# GPT-2 trained on tokens_masked.bin, a masked shard of documents (a prompt of 1..40 tokens that
# is not trained, then an answer of 1..12 that is), with 2 micro-batches a step; tokens 384..513
# are one long prompt, so step 1's second micro-batch has no target that counts. Each step's loss
# is cross_entropy(ignore_index=-100, reduction="sum") over its micro-batches divided by their
# counted targets (Hugging Face Trainer's num_items_in_batch); val_loss: the trained model's loss over
# the file's 16 batches, the mean over all their counted targets.
MASKED = dict(TRAIN, steps=8, grad_accum=2)
MASKED_EVAL_BATCHES = 16
MASKED_MAGIC = 20261129


def masked_tokens(n, vocab, gen):
    """(ids int64 (n,), trained bool (n,)) of prompt/answer documents."""
    ids = torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int64)
    trained = torch.zeros(n, dtype=torch.bool)
    at = 0
    while at < n:
        at += int(torch.randint(1, 41, (1,), generator=gen))  # the prompt
        answer = int(torch.randint(1, 13, (1,), generator=gen))
        trained[at:at + answer] = True
        at += answer
    trained[384:514] = False  # every target of batch 3 (tokens 385..512)
    return ids, trained


def write_masked_shard(path, ids, trained):
    """Stratum's masked shard: llm.c's 256-int32 header with MASKED_MAGIC, version 1, then the
    uint32 ids, bit 31 set on tokens that are no loss targets."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = [MASKED_MAGIC, 1, ids.numel()]
    body = ids.numpy().astype("<u4") | np.where(trained.numpy(), 0, 0x80000000).astype("<u4")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(body.tobytes())


def make_masked(out_dir):
    """tokens_masked.bin, train_args_masked.json and reference_masked.safetensors."""
    cfg = tg.GPT2Config(**TINY)
    init, _ = tg.load_safetensors(os.path.join(out_dir, "model.safetensors"))
    params = {n: t.to(torch.float32).detach().clone().requires_grad_(True) for n, t in init.items()}
    a = MASKED
    B, T, N = a["batch"], a["seq"], a["grad_accum"]
    ids, trained = masked_tokens(a["steps"] * N * B * T + 1, cfg.vocab_size, torch.Generator().manual_seed(TOKENS_SEED + 1))
    write_masked_shard(os.path.join(out_dir, "tokens_masked.bin"), ids, trained)
    with open(os.path.join(out_dir, "train_args_masked.json"), "w") as f:
        json.dump(a, f, indent=2)
        f.write("\n")
    opt = tg.make_optimizer(params, a["lr"], a["beta1"], a["beta2"], a["eps"], a["weight_decay"])
    losses, norms, lrs, counts = [], [], [], []
    for s in range(a["steps"]):
        for t in params.values():
            t.grad = None
        batches = []
        for mb in range(N):
            x, y = tg.get_batch(ids, s * N + mb, B, T)
            _, keep = tg.get_batch(trained, s * N + mb, B, T)
            batches.append((x, torch.where(keep, y, torch.full_like(y, -100))))
        counted = sum(int((y >= 0).sum()) for _, y in batches)
        counts.extend(int((y >= 0).sum()) for _, y in batches)
        total = 0.0
        for x, y in batches:
            logits, _ = tg.forward(params, cfg, x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                     ignore_index=-100, reduction="sum") / counted
            loss.backward()
            total += float(loss.detach())
        lr = tg.lr_at(s, a["lr"], a["warmup"], a["min_lr"], a["steps"], a["lr_schedule"])
        norms.append(tg.grad_norm_and_clip(params, a["grad_clip"]))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(total)
        lrs.append(lr)
    assert 0 in counts, "bug: no micro-batch without targets"
    # The validation loss after training over the same file's 16 batches (--val-data
    # tokens_masked.bin --eval-batches 16): the mean over all their counted targets.
    with torch.no_grad():
        total, counted = 0.0, 0
        for k in range(MASKED_EVAL_BATCHES):
            x, y = tg.get_batch(ids, k, B, T)
            _, keep = tg.get_batch(trained, k, B, T)
            y = torch.where(keep, y, torch.full_like(y, -100))
            logits, _ = tg.forward(params, cfg, x)
            total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                             ignore_index=-100, reduction="sum"))
            counted += int((y >= 0).sum())
    out = {"val_loss": torch.tensor([total / counted], dtype=torch.float32),
           "train_losses": torch.tensor(losses, dtype=torch.float32),
           "train_grad_norms": torch.tensor(norms, dtype=torch.float32),
           "train_lrs": torch.tensor(lrs, dtype=torch.float32)}
    for n, t in params.items():
        out["final." + n] = _f32(t)
    tg.save_safetensors(os.path.join(out_dir, "reference_masked.safetensors"), out,
                        metadata={"generator": "tools/make_golden.py --only masked", "torch_version": torch.__version__,
                                  "train_args": json.dumps(a)})
    return {"losses": losses, "counts": counts}


# ----------------------------------------------------------------------------------------------
# ops (float64 compute, F32 storage)

def _meta(**kw):
    d = {"generator": "tools/make_golden.py", "torch_version": torch.__version__,
         "compute_dtype": "float64"}
    d.update({k: str(v) for k, v in kw.items()})
    return d


def make_layernorm(path, gen):
    eps = 1e-5
    x = _rand64(gen, 2, 5, 48, scale=2.0) + 0.5
    w = 1.0 + _rand64(gen, 48, scale=0.1)
    b = _rand64(gen, 48, scale=0.1)
    dout = _rand64(gen, 2, 5, 48)
    for t in (x, w, b):
        t.requires_grad_(True)
    out = torch.nn.functional.layer_norm(x, (48,), w, b, eps)
    out.backward(dout)
    xd = x.detach()
    mean = xd.mean(dim=-1)
    var = ((xd - mean.unsqueeze(-1)) ** 2).mean(dim=-1)  # biased
    rstd = 1.0 / torch.sqrt(var + eps)
    tg.save_safetensors(path, {
        "x": _f32(x), "w": _f32(w), "b": _f32(b), "out": _f32(out), "dout": _f32(dout),
        "dx": _f32(x.grad), "dw": _f32(w.grad), "db": _f32(b.grad),
        "mean": _f32(mean), "rstd": _f32(rstd)},
        metadata=_meta(eps=eps, note="rstd = 1/sqrt(biased_var + eps); mean, rstd per row"))


def make_gelu(path, gen):
    x = torch.linspace(-8.0, 8.0, 1000, dtype=torch.float32).to(torch.float64)
    dout = _rand64(gen, 1000)
    x.requires_grad_(True)
    out = tg.gelu_new(x)
    out.backward(dout)
    tg.save_safetensors(path, {"x": _f32(x), "out": _f32(out), "dout": _f32(dout),
                               "dx": _f32(x.grad)},
                        metadata=_meta(formula="0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))"))


def make_attention(path, gen):
    B, T, H, hd = 2, 7, 3, 8
    C = H * hd
    qkv = _rand64(gen, B, T, 3 * C)
    dout = _rand64(gen, B, T, C)
    qkv.requires_grad_(True)
    out = tg.attention_core(qkv, H)
    out.backward(dout)
    # Attention probabilities (B,H,T,T), for debugging kernels.
    with torch.no_grad():
        q, k, _ = qkv.detach().split(C, dim=2)
        q = q.reshape(B, T, H, hd).permute(0, 2, 1, 3)
        k = k.reshape(B, T, H, hd).permute(0, 2, 1, 3)
        s = q @ k.transpose(-1, -2) / math.sqrt(hd)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        att = torch.softmax(s, dim=-1)
    tg.save_safetensors(path, {"qkv": _f32(qkv), "out": _f32(out), "dout": _f32(dout),
                               "dqkv": _f32(qkv.grad), "att": _f32(att)},
                        metadata=_meta(B=B, T=T, n_head=H, head_dim=hd, C=C,
                                       note="qkv split q,k,v; heads reshape (B,T,H,hd); causal; "
                                            "scale 1/sqrt(hd); out is heads merged, before c_proj"))


def make_softmax_xent(path, gen):
    B, T, V = 2, 5, 37
    logits = _rand64(gen, B, T, V, scale=2.0)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    logits.requires_grad_(True)
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                                               reduction="none").reshape(B, T)
    loss = losses.mean()
    loss.backward()
    probs = torch.softmax(logits.detach(), dim=-1)
    tg.save_safetensors(path, {"logits": _f32(logits), "targets": targets.to(torch.int32),
                               "losses": _f32(losses), "loss": _f32(loss.reshape(1)),
                               "dlogits": _f32(logits.grad), "probs": _f32(probs)},
                        metadata=_meta(note="dlogits is d(mean loss)/dlogits = "
                                            "(probs - onehot)/(B*T)"))


def make_adamw(path, gen):
    n = 257
    lr, beta1, beta2, eps, wd, step = 3e-4, 0.9, 0.95, 1e-8, 0.1, 3
    param = _rand64(gen, n)
    grad = _rand64(gen, n)
    m = _rand64(gen, n, scale=0.1)
    v = _rand64(gen, n, scale=0.1) ** 2
    v = v.to(torch.float32).to(torch.float64)
    # torch.optim.AdamW (foreach=False) update, float64: state at step 2 -> step 3.
    p = param.clone().requires_grad_(False)
    opt = torch.optim.AdamW([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd,
                            foreach=False)
    p.grad = grad.clone()
    opt.state[p] = {"step": torch.tensor(float(step - 1)), "exp_avg": m.clone(),
                    "exp_avg_sq": v.clone()}
    opt.step()
    st = opt.state[p]
    # Independent formula check.
    p2 = param * (1 - lr * wd)
    m2 = beta1 * m + (1 - beta1) * grad
    v2 = beta2 * v + (1 - beta2) * grad * grad
    p2 = p2 - (lr / (1 - beta1 ** step)) * m2 / (v2.sqrt() / math.sqrt(1 - beta2 ** step) + eps)
    assert torch.allclose(p2, p, rtol=0, atol=1e-15), "bug: AdamW formula disagrees with torch"
    tg.save_safetensors(path, {"param": _f32(param), "grad": _f32(grad), "m": _f32(m),
                               "v": _f32(v), "new_param": _f32(p), "new_m": _f32(st["exp_avg"]),
                               "new_v": _f32(st["exp_avg_sq"])},
                        metadata=_meta(lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                       weight_decay=wd, step=step,
                                       note="m, v are the state after step-1 updates; step is "
                                            "the 1-based count after this update (bias "
                                            "correction uses it)"))


def make_matmul(path, gen):
    x = _rand64(gen, 2, 5, 24)
    W = _rand64(gen, 24, 40, scale=0.2)
    b = _rand64(gen, 40, scale=0.1)
    dy = _rand64(gen, 2, 5, 40)
    for t in (x, W, b):
        t.requires_grad_(True)
    y = tg.conv1d(x, W, b)
    y.backward(dy)
    tg.save_safetensors(path, {"x": _f32(x), "W": _f32(W), "b": _f32(b), "y": _f32(y),
                               "dy": _f32(dy), "dx": _f32(x.grad), "dW": _f32(W.grad),
                               "db": _f32(b.grad)},
                        metadata=_meta(note="HF Conv1D: y = x @ W + b, W stored (in, out)"))


def make_ops(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    makers = [("layernorm", make_layernorm), ("gelu", make_gelu), ("attention", make_attention),
              ("softmax_xent", make_softmax_xent), ("adamw", make_adamw),
              ("matmul", make_matmul)]
    for i, (name, fn) in enumerate(makers):
        gen = torch.Generator().manual_seed(SEED + 1 + i)  # each file independent of the others
        fn(os.path.join(out_dir, name + ".safetensors"), gen)
    return [m[0] for m in makers]


def summarize(root):
    total = 0
    for dirpath, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            sz = os.path.getsize(p)
            total += sz
            line = f"  {os.path.relpath(p, root):45s} {sz:9d} B"
            if f.endswith(".safetensors"):
                tensors, _ = tg.load_safetensors(p)
                line += f"  {len(tensors)} tensors"
            print(line)
    print(f"  total {total} B ({total / 2**20:.2f} MiB)")
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "golden"))
    ap.add_argument("--only", choices=["autocast", "zo", "lora", "masked"],
                    help="autocast: regenerate only tiny_gpt2/reference_bf16.safetensors; "
                         "masked: only tiny_gpt2/{tokens_masked.bin,train_args_masked.json,reference_masked.safetensors}; "
                         "zo: only tiny_gpt2/reference_zo.safetensors; "
                         "lora: only tiny_gpt2/{lora_init/,reference_lora*.safetensors,lora_args.json}")
    args = ap.parse_args()
    torch.set_num_threads(2)
    root = os.path.normpath(args.out)
    if args.only is None:
        info = make_tiny(os.path.join(root, "tiny_gpt2"))
    if args.only in (None, "lora"):
        lo = make_lora(os.path.join(root, "tiny_gpt2"))
        print(f"tiny_gpt2 LoRA: {lo['tensors']} adapter tensors, losses {[round(v, 4) for v in lo['losses']]}, "
              f"largest adapter move {lo['largest_move']:.2e}")
    if args.only == "lora":
        return
    if args.only in (None, "masked"):
        ma = make_masked(os.path.join(root, "tiny_gpt2"))
        print(f"tiny_gpt2 loss mask: targets per micro-batch {ma['counts']}, "
              f"losses {[round(v, 4) for v in ma['losses']]}")
    if args.only == "masked":
        return
    if args.only in (None, "zo"):
        zo = make_zo(os.path.join(root, "tiny_gpt2"))
        print(f"tiny_gpt2 zo-sgd: projected gradients {', '.join(f'{g:.4f}' for g in zo['grads'])}, "
              f"largest parameter move {zo['largest_move']:.2e}")
    if args.only == "zo":
        return
    auto = make_autocast(os.path.join(root, "tiny_gpt2"))
    print(f"tiny_gpt2 bf16 autocast: loss after 20 steps {auto['bf16_loss_last']:.6f}, "
          f"largest |bf16 - fp32| loss difference {auto['max_bf16_fp32_loss_diff']:.6f}")
    if args.only == "autocast":
        return
    ops = make_ops(os.path.join(root, "ops"))
    print(f"tiny_gpt2: {info['n_params']} params, loss0 {info['loss0']:.6f}, "
          f"loss after 20 steps {info['loss_last']:.6f}, grad_norm0 {info['norm0']:.6f}")
    print(f"ops: {', '.join(ops)}")
    total = summarize(root)
    assert total < 5 * 2**20, f"golden dir too large: {total} B"


if __name__ == "__main__":
    main()
