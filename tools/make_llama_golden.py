"""Regenerates Stratum's Llama golden files, deterministically.

What it does: writes tests/golden/tiny_llama/ (a tiny Llama in Hugging Face layout with llama3
RoPE scaling and grouped-query attention, stored as two safetensors shards plus the index;
its logits, loss and gradients for one batch; RoPE tables; a greedy continuation; an 8-step
AdamW training run) and tests/golden/tiny_llama_bf16/ (the same weights rounded to bf16 in one
BF16 model.safetensors, with logits computed in fp32 from the rounded weights) and
tests/golden/tiny_qwen2/ (the tiny shape as a Qwen2: q, k and v biases; logits, loss, gradients,
a greedy continuation, an 8-step AdamW run and a LoRA run over it). Before writing
it runs self-checks of the PyTorch reference (RoPE, GQA, RMSNorm, causality, gradients).
What it does not do: anything with real Llama weights or a tokenizer; it uses no
`transformers` (tools/torch_llama.py reimplements LlamaForCausalLM).

Run: /usr/bin/python3 tools/make_llama_golden.py [--out tests/golden]
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
import torch_llama as tl  # noqa: E402
import torch_lora  # noqa: E402
import torch_zo  # noqa: E402

SEED = 1234
TOKENS_SEED = 4321
CHECK_SEED = 999  # self-checks only; never affects the written files


def llama3_scaling(original_max):
    """Llama 3's rope scaling (factor 8, low 1, high 4) over an original context of original_max."""
    return {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": original_max}


ROPE_SCALING = llama3_scaling(16)
TINY = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=64, vocab_size=131,
            rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=ROPE_SCALING,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
# Init stds, larger than HF's 0.02 on purpose: attention is far from uniform (q/k), every
# sublayer moves the residual stream, and logits spread (std ~1.6) so greedy decoding has
# clear winners. Norm weights are 1 + 0.1*N(0,1).
INIT_STDS = {"embed_tokens.weight": 1.0, "q_proj.weight": 0.2, "k_proj.weight": 0.2,
             "v_proj.weight": 0.1, "o_proj.weight": 0.1, "gate_proj.weight": 0.1,
             "up_proj.weight": 0.1, "down_proj.weight": 0.1, "lm_head.weight": 0.2}
REF_BATCH, REF_SEQ = 2, 24           # reference batch: positions 16..23 lie beyond
                                     # original_max_position_embeddings (16)
PROMPT = [1, 5, 9, 17, 33]
N_NEW = 12
TRAIN = dict(batch=2, seq=16, steps=8, lr=1e-3, lr_schedule="cosine", warmup=2, min_lr=1e-4,
             beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
# Two shards, split the way save_pretrained(max_shard_size=...) splits: shard 1 ends inside
# layer 1 (after its q_proj), so one layer's tensors span both files.
MAX_SHARD_SIZE_BYTES = 240_000
# A second llama3 setting whose inv_freq hits all three branches (kept / smoothed / divided);
# the model's own setting has no wavelength below high_freq_wavelen = 4.
ROPE_SCALING_ALT = llama3_scaling(40)

# A one-layer Llama with a 131072-token context and Llama 3.1's rope scaling (factor 8 over an
# original 8192): its logits at positions up to 131071 (tests/golden/long_rope/). The tokens are
# a formula the C++ test repeats, so nothing but the weights and the logits is stored.
LONG_ROPE_SCALING = llama3_scaling(8192)
LONG = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, max_position_embeddings=131072, vocab_size=64,
            rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=LONG_ROPE_SCALING,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
LONG_SEED = 2468
LONG_POSITIONS = [0, 8191, 8192, 131071]


def long_rope_ids(n):
    """Token t of the long sequence: (37 t + (t >> 7)) mod 64."""
    t = torch.arange(n, dtype=torch.int64)
    return (37 * t + (t >> 7)) % 64



def _f32(t):
    return t.detach().to(torch.float32).contiguous()


def _i32(x):
    return torch.as_tensor(x, dtype=torch.int64).to(torch.int32).contiguous()


# ----------------------------------------------------------------------------------------------
# Self-checks of the reference (float64 where it matters)

def _meta_llama3_apply_scaling(freqs, rs):
    """Meta's original llama3 apply_scaling, in python floats: an independent formulation."""
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    lo_wl, hi_wl = old / lo, old / hi
    out, branches = [], set()
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(f)
            branches.add("kept")
        elif wl > lo_wl:
            out.append(f / factor)
            branches.add("divided")
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
            branches.add("smoothed")
    return out, branches


def _plain_mha(h, wq, wk, wv, wo, cos, sin, H, hd, cap=None):
    """Independent multi-head attention for one sequence h (T,C), per head, float64; cap: Gemma 2's
    soft-capping of the scores."""
    T = h.shape[0]
    outs = []
    for hh in range(H):
        sl = slice(hh * hd, (hh + 1) * hd)
        q, k, v = h @ wq[sl].T, h @ wk[sl].T, h @ wv[sl].T              # (T,hd)
        rd = cos.shape[-1]  # the rotary channels; the rest pass through (partial rotary)
        half = rd // 2
        rot = lambda x: torch.cat((-x[:, half:rd], x[:, :half]), dim=1)  # noqa: E731
        q = torch.cat((q[:, :rd] * cos + rot(q) * sin, q[:, rd:]), dim=1)
        k = torch.cat((k[:, :rd] * cos + rot(k) * sin, k[:, rd:]), dim=1)
        s = (q @ k.T) / math.sqrt(hd)
        if cap is not None:
            s = cap * torch.tanh(s / cap)
        for i in range(T):
            s[i, i + 1:] = float("-inf")
        outs.append(torch.softmax(s, dim=1) @ v)
    return torch.cat(outs, dim=1) @ wo.T


def self_check(cfg, params, shape=TINY):
    gen = torch.Generator().manual_seed(CHECK_SEED)
    hd = cfg.head_dim

    # RoPE: inv_freq vs Meta's formulation; branch coverage of the alternative setting.
    base = tl.rope_inv_freq_default(cfg.rope_theta, hd)
    for rs, need in ((cfg.rope_scaling, {"smoothed", "divided"}),
                     (ROPE_SCALING_ALT, {"kept", "smoothed", "divided"})):
        if rs is None or rs.get("rope_type") != "llama3":  # Qwen2's default rope, Gemma 3's linear
            continue
        ours = tl.rope_inv_freq_llama3(base, rs["factor"], rs["low_freq_factor"],
                                       rs["high_freq_factor"],
                                       rs["original_max_position_embeddings"])
        ref, branches = _meta_llama3_apply_scaling(base.double().tolist(), rs)
        assert torch.allclose(ours.double(), torch.tensor(ref, dtype=torch.float64), rtol=1e-6,
                              atol=0), "bug: llama3 inv_freq disagrees with Meta's formula"
        assert branches == need, f"llama3 branches {branches}, expected {need}"
    inv = tl.rope_inv_freq(cfg)
    # RoPE at position 0 is the identity (cos 1, sin 0 exactly).
    cos, sin = tl.rope_cos_sin(inv, torch.zeros(1, 1, dtype=torch.int64))
    assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(sin, torch.zeros_like(sin))
    x = torch.randn(1, 3, 1, hd, generator=gen)
    assert torch.equal(tl.apply_rope(x, cos, sin), x), "bug: rope at position 0 is not identity"
    # RoPE is a rotation of pairs (i, i+hd/2) and scores depend only on the position offset.
    # (float64 angles here: rope_cos_sin computes them in fp32 as transformers does.)
    freqs = torch.arange(40, dtype=torch.float64)[:, None] * inv.double()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(0)
    cos, sin = emb.cos(), emb.sin()
    # The same q and the same k vector at every position.
    q = torch.randn(1, 1, 1, hd, generator=gen, dtype=torch.float64).expand(1, 1, 40, hd)
    k = torch.randn(1, 1, 1, hd, generator=gen, dtype=torch.float64).expand(1, 1, 40, hd)
    qr, kr = tl.apply_rope(q, cos, sin), tl.apply_rope(k, cos, sin)
    rd = 2 * inv.numel()  # the rotary channels (Phi-4-mini's partial rotary: fewer than hd)
    pair_norm = lambda t: t[..., : rd // 2] ** 2 + t[..., rd // 2:rd] ** 2  # noqa: E731
    assert torch.allclose(pair_norm(qr), pair_norm(q), atol=1e-12), "bug: rope is not a rotation"
    assert torch.equal(qr[..., rd:], q[..., rd:]), "bug: the channels past the rotary ones moved"
    s = (qr[0, 0] @ kr[0, 0].T)    # s[m, n] depends on m - n only
    for d in (0, 3, 17):
        diag = torch.diagonal(s, offset=-d)
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-10), "bug: rope not relative"

    # RMSNorm vs a float64 formula.
    xx = torch.randn(3, 5, cfg.hidden_size, generator=gen, dtype=torch.float64) * 3 + 0.5
    w = 1 + 0.1 * torch.randn(cfg.hidden_size, generator=gen, dtype=torch.float64)
    ref = w * xx / torch.sqrt((xx * xx).sum(-1, keepdim=True) / cfg.hidden_size + cfg.rms_norm_eps)
    assert torch.allclose(tl.rms_norm(xx, w - cfg.norm_offset, cfg.rms_norm_eps, cfg.norm_offset), ref, rtol=1e-12,
                          atol=0), "bug: RMSNorm disagrees with its float64 formula"

    p64 = {n: t.double() for n, t in params.items()}
    T = 20
    idx = torch.randint(0, cfg.vocab_size, (2, T), generator=gen)
    pos = torch.arange(T, dtype=torch.int64).unsqueeze(0).expand(2, T)
    cos, sin = tl.rope_cos_sin(inv, pos)
    cos, sin = cos.double(), sin.double()
    h = torch.randn(2, T, cfg.hidden_size, generator=gen, dtype=torch.float64)

    # GQA with KV == H against an independent per-head MHA.
    cfg_mha = tl.LlamaConfig(**dict(shape, num_key_value_heads=shape["num_attention_heads"]))
    H = cfg.num_attention_heads
    C = cfg.hidden_size
    pm = {"l.self_attn.q_proj.weight": torch.randn(H * hd, C, generator=gen, dtype=torch.float64),
          "l.self_attn.k_proj.weight": torch.randn(H * hd, C, generator=gen, dtype=torch.float64),
          "l.self_attn.v_proj.weight": torch.randn(H * hd, C, generator=gen, dtype=torch.float64),
          "l.self_attn.o_proj.weight": torch.randn(C, H * hd, generator=gen, dtype=torch.float64)}
    pm = {n: t * 0.2 for n, t in pm.items()}
    got = tl.attention(h, pm, "l.", cfg_mha, cos, sin)
    for b in range(2):
        want = _plain_mha(h[b], *(pm["l.self_attn." + k + "_proj.weight"] for k in "qkvo"),
                          cos[b], sin[b], H, hd, cfg.attn_logit_softcapping)
        assert torch.allclose(got[b], want, rtol=0, atol=1e-12), "bug: attention != plain MHA"

    # GQA (KV=2) == MHA whose k/v weights repeat each kv head for its group of query heads.
    n_rep = H // cfg.num_key_value_heads
    pq = dict(p64)
    for i in range(cfg.num_hidden_layers):
        for k in ("k_proj", "v_proj"):
            n = f"model.layers.{i}.self_attn.{k}.weight"
            pq[n] = p64[n].view(cfg.num_key_value_heads, hd, C).repeat_interleave(n_rep, 0)
            pq[n] = pq[n].reshape(H * hd, C)
            b = f"model.layers.{i}.self_attn.{k}.bias"
            if b in p64:  # Qwen2
                pq[b] = p64[b].view(cfg.num_key_value_heads, hd).repeat_interleave(n_rep, 0).reshape(H * hd)
    lg_gqa, _ = tl.forward(p64, cfg, idx)
    lg_mha, _ = tl.forward(pq, cfg_mha, idx)
    assert torch.allclose(lg_gqa, lg_mha, rtol=0, atol=1e-10), "bug: GQA != MHA with repeated kv"

    # Causality: changing the last token leaves earlier logits alone.
    idx2 = idx.clone()
    idx2[:, -1] = (idx2[:, -1] + 1) % cfg.vocab_size
    lg2, _ = tl.forward(p64, cfg, idx2)
    assert torch.allclose(lg_gqa[:, :-1], lg2[:, :-1], rtol=0, atol=1e-12), "bug: not causal"
    assert not torch.allclose(lg_gqa[:, -1], lg2[:, -1]), "bug: last token has no effect"

    # Gradients: finite, and autograd agrees with a central difference along a random direction.
    tgt = torch.randint(0, cfg.vocab_size, (2, T), generator=gen)
    pg = {n: t.clone().requires_grad_(True) for n, t in p64.items()}
    _, loss = tl.forward(pg, cfg, idx, tgt)
    loss.backward()
    assert all(torch.isfinite(t.grad).all() for t in pg.values()), "bug: non-finite gradient"
    assert all(float(t.grad.abs().max()) > 0 for t in pg.values()), "bug: zero gradient"
    for name in list(p64)[:3] + [n for n in p64 if "norm" in n][:2] + [n for n in ["lm_head.weight"] if n in p64] + [None]:
        names = list(p64) if name is None else [name]
        d = {n: torch.randn(p64[n].shape, generator=gen, dtype=torch.float64) for n in names}
        eps = 1e-6
        plus = dict(p64, **{n: p64[n] + eps * d[n] for n in names})
        minus = dict(p64, **{n: p64[n] - eps * d[n] for n in names})
        fd = (float(tl.forward(plus, cfg, idx, tgt)[1]) -
              float(tl.forward(minus, cfg, idx, tgt)[1])) / (2 * eps)
        an = sum(float((pg[n].grad * d[n]).sum()) for n in names)
        assert abs(fd - an) <= 1e-6 * max(1.0, abs(an)), f"bug: gradient check {name}: {fd} {an}"

    # fp32 reference vs float64 on the same weights: fp32 rounding stays small.
    lg32, _ = tl.forward(params, cfg, idx)
    assert torch.allclose(lg32.double(), lg_gqa, rtol=0, atol=1e-4), "fp32 forward drifts"


# ----------------------------------------------------------------------------------------------
# Files

def train_run(cfg, init, tokens, a, autocast=False):
    params = {n: t.detach().clone().requires_grad_(True) for n, t in init.items()}
    opt = tg.make_optimizer(params, a["lr"], a["beta1"], a["beta2"], a["eps"], a["weight_decay"])
    losses, norms, lrs = [], [], []
    for s in range(a["steps"]):
        lr = tg.lr_at(s, a["lr"], a["warmup"], a["min_lr"], a["steps"], a["lr_schedule"])
        loss_s, norm_s = tl.train_step(params, cfg, opt, tokens, s, a["batch"], a["seq"], lr,
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


def load_shards(out_dir):
    """The weights of out_dir's model-*.safetensors shards, as float32."""
    init = {}
    for name in sorted(os.listdir(out_dir)):
        if name.startswith("model-") and name.endswith(".safetensors"):
            tensors, _ = tg.load_safetensors(os.path.join(out_dir, name))
            init.update({n: t.to(torch.float32) for n, t in tensors.items()})
    return init


def make_autocast(root):
    """tiny_llama/reference_bf16.safetensors: the TRAIN run with the forward under CPU autocast
    to bfloat16 (what `stratum train --precision bf16` is checked against), from the shards and
    tokens.bin already there, plus the fp32 run's losses for scale."""
    out_dir = os.path.join(root, "tiny_llama")
    cfg = tl.LlamaConfig(**TINY)
    init = load_shards(out_dir)
    tokens = torch.from_numpy(np.fromfile(os.path.join(out_dir, "tokens.bin"), dtype="<u2").astype(np.int64))
    bf16 = train_run(cfg, init, tokens, TRAIN, autocast=True)
    fp32 = train_run(cfg, init, tokens, TRAIN)
    tg.save_safetensors(os.path.join(out_dir, "reference_bf16.safetensors"),
                        {"train_losses": bf16["train_losses"], "train_grad_norms": bf16["train_grad_norms"],
                         "fp32_train_losses": fp32["train_losses"]},
                        metadata={"generator": "tools/make_llama_golden.py --only autocast",
                                  "torch_version": torch.__version__, "train_args": json.dumps(TRAIN)})
    return (bf16["train_losses"] - fp32["train_losses"]).abs().max().item()


# Zeroth-order SGD (MeZO) from the same shards and tokens (tools/torch_zo.py); seed is Stratum's
# default. The untied lm_head.weight gets its own z.
ZO = dict(batch=2, seq=16, steps=8, lr=1e-3, lr_schedule="cosine", warmup=2, min_lr=1e-4, zo_eps=1e-3,
          weight_decay=0.1, seed=1337)


def make_zo(root):
    """tiny_llama/reference_zo.safetensors: ZO steps of the tiny Llama."""
    out_dir = os.path.join(root, "tiny_llama")
    cfg = tl.LlamaConfig(**TINY)
    return torch_zo.write_reference(out_dir, load_shards(out_dir), lambda p, x, y: tl.forward(p, cfg, x, y)[1], ZO,
                                    "tools/make_llama_golden.py --only zo")["grads"]


# LoRA (tools/torch_lora.py) on all seven linears of each block, rsLoRA scaling, 8 AdamW steps.
LORA_TRAIN = dict(batch=2, seq=16, steps=8, lr=1e-2, lr_schedule="cosine", warmup=2, min_lr=1e-3, beta1=0.9,
                  beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
LORA = dict(r=4, alpha=8.0, rslora=True,
            targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            modules=torch_lora.LLAMA_MODULES, layer_prefix="model.layers.", n_layer=TINY["num_hidden_layers"],
            fan_in_fan_out=False, seed=SEED + 7)


# The same run with lora_dropout 0.1 (Stratum's mask, torch_lora.dropout_mask) under --seed 1337.
LORA_DROPOUT = dict(p=0.1, seed=1337)


def make_lora(root):
    """tiny_llama/{lora_init/, reference_lora.safetensors, lora_args.json}."""
    out_dir = os.path.join(root, "tiny_llama")
    cfg = tl.LlamaConfig(**TINY)
    base = load_shards(out_dir)
    fwd = lambda p, x, y, ad: tl.forward(p, cfg, x, y, adapter=ad)[1]  # noqa: E731
    info = torch_lora.write_reference(out_dir, base, fwd, LORA_TRAIN, LORA, "tools/make_llama_golden.py --only lora")
    torch_lora.write_zo_reference(out_dir, base, fwd, LORA, ZO, "tools/make_llama_golden.py --only lora")
    info["dropout"] = torch_lora.write_reference(out_dir, base, fwd, LORA_TRAIN, LORA,
                                                 "tools/make_llama_golden.py --only lora", dropout=LORA_DROPOUT)["losses"]
    return info


def greedy(params, cfg):
    ids, step_logits, margin = tl.greedy_generate(params, cfg, PROMPT, N_NEW)
    assert margin > 1e-2, f"greedy top-1/top-2 margin {margin} too small to be robust"
    # The same tokens come out of one forward over the whole sequence.
    full = torch.tensor([PROMPT + ids], dtype=torch.int64)
    with torch.no_grad():
        lg, _ = tl.forward(params, cfg, full)
    again = [tl.argmax_lowest(lg[0, t]) for t in range(len(PROMPT) - 1, full.shape[1] - 1)]
    assert again == ids, "bug: greedy ids differ from a single full forward"
    return ids, step_logits, margin


def make_tiny(root):
    out_dir = os.path.join(root, "tiny_llama")
    bf_dir = os.path.join(root, "tiny_llama_bf16")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(bf_dir, exist_ok=True)
    cfg = tl.LlamaConfig(**TINY)
    params = tl.init_params(cfg, torch.Generator().manual_seed(SEED), INIT_STDS)
    self_check(cfg, params)

    tl.write_hf_config(os.path.join(out_dir, "config.json"), cfg, "float32")
    shard_files = tl.save_sharded(out_dir, params, MAX_SHARD_SIZE_BYTES)
    assert len(shard_files) == 2, f"expected 2 shards, got {shard_files}"

    B, T, S = TRAIN["batch"], TRAIN["seq"], TRAIN["steps"]
    n_tokens = B * T * S + 1
    assert n_tokens >= REF_BATCH * REF_SEQ + 1
    gen = torch.Generator().manual_seed(TOKENS_SEED)
    tokens = torch.randint(0, cfg.vocab_size, (n_tokens,), generator=gen, dtype=torch.int64)
    tokens.numpy().astype("<u2").tofile(os.path.join(out_dir, "tokens.bin"))
    with open(os.path.join(out_dir, "train_args.json"), "w") as f:
        json.dump(TRAIN, f, indent=2)
        f.write("\n")

    # Reference batch = batch 0 of tokens.bin read with B=2, T=24 (stored explicitly too).
    x, y = tg.get_batch(tokens, 0, REF_BATCH, REF_SEQ)
    for t in params.values():
        t.requires_grad_(True)
    logits, loss = tl.forward(params, cfg, x, y)
    loss.backward()
    assert all(torch.isfinite(t.grad).all() for t in params.values())
    inv = tl.rope_inv_freq(cfg)
    cos, sin = tl.rope_cos_sin(inv, torch.arange(cfg.max_position_embeddings).unsqueeze(0))
    base = tl.rope_inv_freq_default(cfg.rope_theta, cfg.head_dim)
    ra = ROPE_SCALING_ALT
    inv_alt = tl.rope_inv_freq_llama3(base, ra["factor"], ra["low_freq_factor"],
                                      ra["high_freq_factor"],
                                      ra["original_max_position_embeddings"])
    init = {n: t.detach().clone() for n, t in params.items()}
    ids, step_logits, margin = greedy(init, cfg)

    ref = {"input_ids": _i32(x), "targets": _i32(y), "logits": _f32(logits),
           "loss": _f32(loss.reshape(1))}
    for n, t in params.items():
        ref["grad." + n] = _f32(t.grad)
    ref.update({"rope_inv_freq": _f32(inv), "rope_cos": _f32(cos[0]), "rope_sin": _f32(sin[0]),
                "rope_inv_freq_unscaled": _f32(base), "rope_inv_freq_alt": _f32(inv_alt),
                "generate_prompt": _i32(PROMPT), "generate_ids": _i32(ids),
                "generate_logits": _f32(step_logits)})
    run = train_run(cfg, init, tokens, TRAIN)
    ref.update(run)
    losses = run["train_losses"].tolist()
    x0, y0 = tg.get_batch(tokens, 0, B, T)
    with torch.no_grad():
        l0 = float(tl.forward(init, cfg, x0, y0)[1])
    assert abs(losses[0] - l0) < 1e-6, "bug: step-0 training loss != its batch's loss"
    meta = {"generator": "tools/make_llama_golden.py", "torch_version": torch.__version__,
            "seed": SEED, "tokens_seed": TOKENS_SEED, "init_stds": json.dumps(INIT_STDS),
            "train_args": json.dumps(TRAIN), "rope_scaling_alt": json.dumps(ROPE_SCALING_ALT),
            "note": "input_ids/targets = batch 0 of tokens.bin with B=2 T=24; positions 0..T-1; "
                    "generate_logits[k] = last-position logits that chose generate_ids[k]"}
    tg.save_safetensors(os.path.join(out_dir, "reference.safetensors"), ref, metadata=meta)

    # bf16 variant: weights rounded to nearest-even bf16; reference computed in fp32 from them.
    p16 = {n: t.to(torch.bfloat16) for n, t in init.items()}
    tl.write_hf_config(os.path.join(bf_dir, "config.json"), cfg, "bfloat16")
    tl.save_safetensors_hf(os.path.join(bf_dir, "model.safetensors"), p16,
                           metadata={"format": "pt"})
    with torch.no_grad():
        logits16, loss16 = tl.forward(p16, cfg, x, y)
    ids16, step_logits16, margin16 = greedy(p16, cfg)
    ref16 = {"input_ids": _i32(x), "targets": _i32(y), "logits": _f32(logits16),
             "loss": _f32(loss16.reshape(1)), "generate_prompt": _i32(PROMPT),
             "generate_ids": _i32(ids16), "generate_logits": _f32(step_logits16)}
    tg.save_safetensors(os.path.join(bf_dir, "reference.safetensors"), ref16,
                        metadata=dict(meta, note="weights = bf16(round-to-nearest-even) of "
                                                 "tiny_llama; compute in fp32 from the upcast "
                                                 "weights; same input_ids/targets and prompt"))

    # Read back what was written.
    got = {}
    with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    for fname in shard_files:
        tensors, m = tg.load_safetensors(os.path.join(out_dir, fname))
        assert m == {"format": "pt"}
        for n, t in tensors.items():
            assert index["weight_map"][n] == fname
            got[n] = t
    assert set(got) == set(init) and all(torch.equal(got[n], init[n]) for n in init)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in init.values())
    back16, _ = tg.load_safetensors(os.path.join(bf_dir, "model.safetensors"))
    assert all(torch.equal(back16[n].view(torch.int16), p16[n].view(torch.int16)) for n in p16)

    return {"n_params": sum(t.numel() for t in init.values()), "loss0": float(loss),
            "losses": losses, "norms": run["train_grad_norms"].tolist(),
            "ids": ids, "margin": margin, "ids16": ids16, "margin16": margin16,
            "loss16": float(loss16), "shards": {f: sorted(n for n in index["weight_map"]
                                                          if index["weight_map"][n] == f)
                                                for f in shard_files}}


def long_rope_logits(params, cfg, ids, p):
    """Logits at position p of a one-layer model, from query row p alone: the keys and values of
    rows 0..p and the rest of row p (what the full forward gives at p, in O(p) memory)."""
    assert cfg.num_hidden_layers == 1
    eps, H, KV, hd = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pre = "model.layers.0."
    x = params["model.embed_tokens.weight"][ids[: p + 1]][None]           # (1, p+1, C)
    cos, sin = tl.rope_cos_sin(tl.rope_inv_freq(cfg), torch.arange(p + 1, dtype=torch.int64)[None])
    h = tl.rms_norm(x, params[pre + "input_layernorm.weight"], eps)
    lin = lambda m, v: torch.nn.functional.linear(v, params[pre + m + ".weight"])  # noqa: E731
    k = tl.apply_rope(lin("self_attn.k_proj", h).view(1, p + 1, KV, hd).transpose(1, 2), cos, sin)
    v = lin("self_attn.v_proj", h).view(1, p + 1, KV, hd).transpose(1, 2)
    q = tl.apply_rope(lin("self_attn.q_proj", h[:, p:]).view(1, 1, H, hd).transpose(1, 2),
                      cos[:, p:], sin[:, p:])
    k, v = tl.repeat_kv(k, H // KV), tl.repeat_kv(v, H // KV)
    att = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * (hd ** -0.5), dim=-1)  # (1,H,1,p+1)
    y = torch.matmul(att, v).transpose(1, 2).reshape(1, 1, H * hd)
    xp = x[:, p:] + lin("self_attn.o_proj", y)
    xp = xp + tl.mlp(tl.rms_norm(xp, params[pre + "post_attention_layernorm.weight"], eps), params, pre)
    xp = tl.rms_norm(xp, params["model.norm.weight"], eps)
    return torch.nn.functional.linear(xp, params["lm_head.weight"])[0, 0]


def make_long_rope(root):
    """tests/golden/long_rope/: config.json, model.safetensors and reference.safetensors (the
    logits at LONG_POSITIONS). Self-check: the one-row logits equal the full forward's at
    positions below 600 (where the full (T, T) reference fits)."""
    out_dir = os.path.join(root, "long_rope")
    os.makedirs(out_dir, exist_ok=True)
    cfg = tl.LlamaConfig(**LONG)
    params = tl.init_params(cfg, torch.Generator().manual_seed(LONG_SEED), INIT_STDS)
    ids = long_rope_ids(LONG_POSITIONS[-1] + 1)
    full, _ = tl.forward(params, cfg, ids[:600][None])
    for p in (0, 7, 599):
        err = (long_rope_logits(params, cfg, ids, p) - full[0, p]).abs().max().item()
        assert err < 1e-5, f"one-row logits at {p} differ from the full forward by {err}"
    logits = torch.stack([long_rope_logits(params, cfg, ids, p) for p in LONG_POSITIONS])
    tl.write_hf_config(os.path.join(out_dir, "config.json"), cfg, "float32")
    tl.save_safetensors_hf(os.path.join(out_dir, "model.safetensors"), params,
                           metadata={"format": "pt"})
    tg.save_safetensors(os.path.join(out_dir, "reference.safetensors"),
                        {"positions": _i32(LONG_POSITIONS), "logits": _f32(logits)},
                        metadata={"generator": "tools/make_llama_golden.py --only long_rope"})
    return logits


# A tiny Qwen2 (tests/golden/tiny_qwen2/): the tiny Llama's shape with model_type "qwen2", so its
# q, k and v projections have biases, no rope scaling and Qwen2's rope_theta and eps; one
# model.safetensors. Its logits, loss and gradients for one batch, a greedy continuation and an
# 8-step AdamW run, as for the tiny Llama.
QWEN2 = dict(TINY, model_type="qwen2", rope_theta=1000000.0, rope_scaling=None, rms_norm_eps=1e-6)
QWEN2_SEED = 5678
QWEN2_STDS = dict(INIT_STDS, bias=0.5)  # biases large enough to move the attention
# A tiny Qwen3 (tests/golden/tiny_qwen3/): model_type "qwen3", so every query and key head is
# RMSNorm'd (q_norm, k_norm) before the rope; head_dim 32 with 4 heads, so the attention is wider
# (128) than the residual stream (64), as in Qwen3-0.6B (16 heads of 128 over 1024).
QWEN3 = dict(QWEN2, model_type="qwen3", head_dim=32)
QWEN3_SEED = 6789
# A tiny Gemma (tests/golden/tiny_gemma/): model_type "gemma", so every RMSNorm multiplies by
# (1 + w), the MLP is GeGLU and the embedding rows are scaled by sqrt(64) = 8 (Note [gemma]);
# tied LM head, one key/value head (Gemma 2B's multi-query attention) and heads of 32 over a
# residual stream of 64 (Gemma's 256 over 2048). The embedding's std is 0.1, so the scaled rows
# (std 0.8) and the tied head's logits stay in the range of the other tiny models' (at 0.3 every
# position predicted its own token with a loss of 17).
GEMMA = dict(TINY, model_type="gemma", head_dim=32, num_key_value_heads=1, rope_theta=10000.0, rope_scaling=None,
             rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1)
GEMMA_SEED = 8901
GEMMA_STDS = dict(INIT_STDS, **{"embed_tokens.weight": 0.1})
# A tiny Gemma 3 (tests/golden/tiny_gemma3/): model_type "gemma3_text", so on top of Gemma's
# changes each query and key head is normed (by 1 + w), the attention's and the MLP's outputs are
# normed before their residual adds, layer 0 is a sliding layer (rope base 10000, a window of 8
# keys, shorter than the reference batch's 24 and the training run's 16 positions) and layer 1 a
# full one (rope_theta 1e6 with Gemma 3 4B's linear scaling by 8).
GEMMA3 = dict(GEMMA, model_type="gemma3_text", sliding_window=8, layer_types=["sliding_attention", "full_attention"],
              rope_local_base_freq=10000.0, rope_theta=1000000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
              query_pre_attn_scalar=32)
GEMMA3_SEED = 9013
# A tiny Gemma 2 (tests/golden/tiny_gemma2/): model_type "gemma2", so on top of Gemma's changes the
# attention's and the MLP's outputs are normed before their residual adds, layer 0 is a sliding
# layer (a window of 8 keys) and layer 1 a full one, one rope (base 10000), and it soft-caps the
# attention scores (Note [softcapping]) and the logits (Note [final softcapping]). The caps are
# small (2 and 1.5, Gemma 2's are 50 and 30) so that they bend most scores and logits of this tiny
# model: without them the logits move by more than 0.1.
GEMMA2 = dict(GEMMA, model_type="gemma2", sliding_window=8, layer_types=["sliding_attention", "full_attention"],
              query_pre_attn_scalar=32, attn_logit_softcapping=4.0, final_logit_softcapping=5.0)
GEMMA2_SEED = 9035


# A tiny Mistral (tests/golden/tiny_mistral/): Llama's math with a sliding window of 6 keys in
# every layer (Note [mistral window]), so the reference's 24 positions, the training's 16 and the
# greedy run's 17 run past it; no rope scaling (MistralConfig has none).
MISTRAL = dict(TINY, model_type="mistral", rope_scaling=None, sliding_window=6)
MISTRAL_SEED = 4242


def mistral_unwindowed(params, cfg):
    """The Mistral's weights without its window."""
    return params, tl.LlamaConfig(**dict(MISTRAL, sliding_window=None))


def first_batch_reference(out_dir, cfg, params, tokens_seed):
    """tokens.bin (TRAIN's steps of random ids from tokens_seed) and train_args.json into out_dir,
    and batch 0's reference (B=REF_BATCH, T=REF_SEQ): (tokens, the initial weights, {input_ids,
    targets, logits, loss, generate_*}, the gradients by name, the loss, the greedy ids, their
    margin)."""
    B, T, S = TRAIN["batch"], TRAIN["seq"], TRAIN["steps"]
    gen = torch.Generator().manual_seed(tokens_seed)
    tokens = torch.randint(0, cfg.vocab_size, (B * T * S + 1,), generator=gen, dtype=torch.int64)
    tokens.numpy().astype("<u2").tofile(os.path.join(out_dir, "tokens.bin"))
    with open(os.path.join(out_dir, "train_args.json"), "w") as f:
        json.dump(TRAIN, f, indent=2)
        f.write("\n")
    x, y = tg.get_batch(tokens, 0, REF_BATCH, REF_SEQ)
    init = {n: t.detach().clone() for n, t in params.items()}
    for t in params.values():
        t.requires_grad_(True)
    logits, loss = tl.forward(params, cfg, x, y)
    loss.backward()
    ids, step_logits, margin = greedy(init, cfg)
    ref = {"input_ids": _i32(x), "targets": _i32(y), "logits": _f32(logits), "loss": _f32(loss.reshape(1)),
           "generate_prompt": _i32(PROMPT), "generate_ids": _i32(ids), "generate_logits": _f32(step_logits)}
    return tokens, init, ref, {n: t.grad for n, t in params.items()}, loss, ids, margin


def qwen_without_its_variant(params):
    """The same weights without what the variant adds: Qwen2's biases zeroed, Qwen3's q and k
    norms dropped (torch_llama.attention then norms nothing): a plain Llama's forward."""
    return {n: (torch.zeros_like(t) if n.endswith(".bias") else t) for n, t in params.items()
            if not n.endswith("_norm.weight") or "self_attn" not in n}


def gemma_as_llama(params, cfg):
    """The Gemma's weights as a Llama computes them: the same norms (1 + w stored), SwiGLU and no
    embedding scale instead of Gemma's GeGLU and scaled rows."""
    llama = tl.LlamaConfig(**dict(GEMMA, model_type="llama"))
    return {n: (t + 1.0 if t.dim() == 1 else t) for n, t in params.items()}, llama


def gemma3_as_gemma(params, cfg):
    """The Gemma 3's weights as a Gemma computes them: no q/k norms, no norms after the attention
    and the MLP, one rope."""
    gemma = tl.LlamaConfig(**{k: v for k, v in GEMMA3.items() if k not in
                              ("sliding_window", "layer_types", "rope_local_base_freq", "query_pre_attn_scalar")}
                           | {"model_type": "gemma"})
    out = {}
    for n, t in params.items():
        if "q_norm" in n or "k_norm" in n or "post_" in n:
            continue
        out[n.replace("pre_feedforward_layernorm", "post_attention_layernorm")] = t
    return out, gemma


def gemma2_uncapped(params, cfg):
    """The Gemma 2's weights without its soft-capping."""
    return params, tl.LlamaConfig(**dict(GEMMA2, attn_logit_softcapping=None, final_logit_softcapping=None))


def make_qwen(root, kind):
    """tests/golden/tiny_<kind>/ for kind "qwen2", "qwen3", "mistral", "gemma", "gemma2" or "gemma3"."""
    shape, seed, stds = {"qwen2": (QWEN2, QWEN2_SEED, QWEN2_STDS), "qwen3": (QWEN3, QWEN3_SEED, INIT_STDS),
                         "mistral": (MISTRAL, MISTRAL_SEED, INIT_STDS),
                         "gemma": (GEMMA, GEMMA_SEED, GEMMA_STDS), "gemma2": (GEMMA2, GEMMA2_SEED, GEMMA_STDS),
                         "gemma3": (GEMMA3, GEMMA3_SEED, GEMMA_STDS)}[kind]
    out_dir = os.path.join(root, "tiny_" + kind)
    os.makedirs(out_dir, exist_ok=True)
    cfg = tl.LlamaConfig(**shape)
    params = tl.init_params(cfg, torch.Generator().manual_seed(seed), stds)
    extra = [n for n in params if n.endswith(".bias") or ("self_attn" in n and n.endswith("_norm.weight"))]
    assert len(extra) == {"qwen2": 3, "qwen3": 2, "mistral": 0, "gemma": 0, "gemma2": 0, "gemma3": 2}[kind] * cfg.num_hidden_layers, extra
    self_check(cfg, params, shape)
    # The variant matters: without its biases (norms; Gemma's GeGLU and embedding scale) the logits
    # move well beyond the tests' tolerance.
    with torch.no_grad():
        idx = torch.arange(20, dtype=torch.int64).unsqueeze(0) % cfg.vocab_size
        plain, plain_cfg = (gemma_as_llama(params, cfg) if kind == "gemma" else gemma3_as_gemma(params, cfg)
                            if kind == "gemma3" else gemma2_uncapped(params, cfg) if kind == "gemma2"
                            else mistral_unwindowed(params, cfg) if kind == "mistral"
                            else (qwen_without_its_variant(params), cfg))
        moved = (tl.forward(params, cfg, idx)[0] - tl.forward(plain, plain_cfg, idx)[0]).abs().max().item()
    assert moved > 0.1, f"the {kind} variant moves the logits by only {moved}"
    tl.write_hf_config(os.path.join(out_dir, "config.json"), cfg, "float32")
    tl.save_safetensors_hf(os.path.join(out_dir, "model.safetensors"), params, metadata={"format": "pt"})

    tokens, init, ref, grads, loss, ids, margin = first_batch_reference(
        out_dir, cfg, params, TOKENS_SEED + {"qwen2": 1, "qwen3": 2, "gemma": 3, "gemma3": 4, "gemma2": 5, "mistral": 6}[kind])
    ref.update({"grad." + n: _f32(g) for n, g in grads.items()})
    run = train_run(cfg, init, tokens, TRAIN)
    ref.update(run)
    tg.save_safetensors(os.path.join(out_dir, "reference.safetensors"), ref,
                        metadata={"generator": "tools/make_llama_golden.py --only " + kind,
                                  "torch_version": torch.__version__, "seed": str(seed),
                                  "init_stds": json.dumps(stds), "train_args": json.dumps(TRAIN),
                                  "note": "input_ids/targets = batch 0 of tokens.bin with B=2 T=24"})
    # LoRA (PEFT semantics, tools/torch_lora.py) on all seven linears over the base.
    fwd = lambda p, xx, yy, ad: tl.forward(p, cfg, xx, yy, adapter=ad)[1]  # noqa: E731
    lora = torch_lora.write_reference(out_dir, init, fwd, LORA_TRAIN, dict(LORA, seed=seed + 7),
                                      "tools/make_llama_golden.py --only " + kind)
    return {"loss0": float(loss), "losses": run["train_losses"].tolist(), "ids": ids, "margin": margin,
            "moved": moved, "lora_losses": lora["losses"]}


# A tiny Phi-3 (tests/golden/tiny_phi3/): model_type "phi3", Llama's math with q, k, v stored as
# one self_attn.qkv_proj.weight and gate, up as one mlp.gate_up_proj.weight (transformers'
# Phi3Attention slices q, k, v in that order; Phi3MLP chunks gate first); no rope scaling (Phi-3's
# released configs have none or longrope). Its references come from the unfused Llama forward,
# the gradients and final weights fused again. LoRA (PEFT semantics) on PEFT's Phi-3 default,
# the fused qkv_proj and gate_up_proj among them: one lora_A over q, k and v, their lora_B rows
# stacked, with and without dropout (one mask per fused module).
PHI3 = dict(TINY, rope_scaling=None)
PHI3_SEED = 7890
# A tiny Phi-3.5 (tests/golden/tiny_phi35/): Phi-3 with longrope (Note [longrope]): 128 positions
# over an original 32, so cos and sin are scaled by sqrt(1 + ln 4 / ln 32); short factors between 1
# and 3 (the reference's 24 positions stay within the original context, where they apply), long
# factors kept for the config only.
PHI35 = dict(PHI3, max_position_embeddings=128, original_max_position_embeddings=32,
             rope_scaling={"type": "longrope", "short_factor": [1.0, 1.05, 1.1, 1.2, 1.4, 1.7, 2.2, 3.0],
                           "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0]})
PHI35_SEED = 7891
# The same Phi-3.5 with an original context of 12 (tests/golden/tiny_phi35_long/): the reference's
# 24 positions and the training's 16 are past it, where transformers turns every position by the
# long factors (Note [longrope]).
PHI35_LONG = dict(PHI35, original_max_position_embeddings=12)
PHI35_LONG_SEED = 7893
# A tiny Phi-4-mini (tests/golden/tiny_phi4mini/): Phi-3.5's longrope, a partial_rotary_factor of
# 0.75 (Note [partial rotary]: the rope turns the first 12 of each head's 16 channels, its six
# factors rotary_dim / 2 long) and a tied LM head, as Phi-4-mini's config has them.
PHI4MINI = dict(PHI35, partial_rotary_factor=0.75, tie_word_embeddings=True,
                rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.2, 3.0],
                              "long_factor": [1.0, 2.0, 4.0, 7.0, 11.0, 16.0]})
PHI4MINI_SEED = 7892
# Tied, the embedding's std of 1 would make every position predict its own token (a loss of 40).
PHI4MINI_STDS = dict(INIT_STDS, **{"embed_tokens.weight": 0.05})
PHI3_MODULES = ["self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"]
PHI3_LORA = dict(LORA, targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], modules=PHI3_MODULES,
                 seed=PHI3_SEED + 7)


def phi3_parts(cfg):
    """{unfused module: (fused module, first row, end row)}."""
    Q = cfg.num_attention_heads * cfg.head_dim
    KV = cfg.num_key_value_heads * cfg.head_dim
    I = cfg.intermediate_size
    return {"self_attn.q_proj": ("self_attn.qkv_proj", 0, Q), "self_attn.k_proj": ("self_attn.qkv_proj", Q, Q + KV),
            "self_attn.v_proj": ("self_attn.qkv_proj", Q + KV, Q + 2 * KV),
            "mlp.gate_proj": ("mlp.gate_up_proj", 0, I), "mlp.up_proj": ("mlp.gate_up_proj", I, 2 * I)}


def phi3_fuse(tensors, cfg, prefix=""):
    """Llama-named tensors (with `prefix`: "grad.", "final.") with q, k, v and gate, up fused."""
    out = {}
    parts = phi3_parts(cfg)
    for name, t in tensors.items():
        if not any(name.endswith("." + m + ".weight") for m in parts):
            out[name] = t
    for i in range(cfg.num_hidden_layers):
        h = f"{prefix}model.layers.{i}."
        for fused in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
            pieces = [m for m, (f, _, _) in parts.items() if f == fused]
            out[h + fused + ".weight"] = torch.cat([tensors[h + m + ".weight"] for m in pieces], dim=0)
    return out


def phi3_split(tensors, cfg):
    """The inverse of phi3_fuse (views of the fused tensors' rows)."""
    out = {n: t for n, t in tensors.items() if not n.endswith(("qkv_proj.weight", "gate_up_proj.weight"))}
    for i in range(cfg.num_hidden_layers):
        h = f"model.layers.{i}."
        for m, (fused, lo, hi) in phi3_parts(cfg).items():
            out[h + m + ".weight"] = tensors[h + fused + ".weight"][lo:hi]
    return out


def phi3_forward_loss(cfg):
    """forward_loss(fused base, x, y, adapter) for torch_lora: the Llama forward over the split
    weights, each part of a fused module adapted by its rows of the fused adapter's output."""
    parts = phi3_parts(cfg)
    widths = {"self_attn.qkv_proj": parts["self_attn.v_proj"][2], "mlp.gate_up_proj": parts["mlp.up_proj"][2]}

    def fwd(p, x, y, ad):
        def adapter(module, xx, yy):
            for m, (fused, lo, hi) in parts.items():
                if module.endswith("." + m):
                    name = module[:-len(m)] + fused
                    zero = torch.zeros(*xx.shape[:-1], widths[fused], dtype=yy.dtype)
                    return yy + ad(name, xx, zero)[..., lo:hi]
            return ad(module, xx, yy)
        return tl.forward(phi3_split(p, cfg), cfg, x, y, adapter=adapter)[1]
    return fwd


def make_phi3(root, kind="phi3"):
    """tests/golden/tiny_phi3/, or (kind "phi35") tiny_phi35/: the same with Phi-3.5's longrope
    (its short factors within the original context; no LoRA references), or (kind "phi35_long")
    tiny_phi35_long/ (its long factors past it), or (kind "phi4mini") tiny_phi4mini/."""
    shape, seed = {"phi3": (PHI3, PHI3_SEED), "phi35": (PHI35, PHI35_SEED), "phi35_long": (PHI35_LONG, PHI35_LONG_SEED),
                   "phi4mini": (PHI4MINI, PHI4MINI_SEED)}[kind]
    out_dir = os.path.join(root, "tiny_" + kind)
    os.makedirs(out_dir, exist_ok=True)
    cfg = tl.LlamaConfig(**shape)
    stds = PHI4MINI_STDS if kind == "phi4mini" else INIT_STDS
    params = tl.init_params(cfg, torch.Generator().manual_seed(seed), stds)
    self_check(cfg, params, shape)
    hf = cfg.to_hf_dict("float32")
    hf.update(model_type="phi3", architectures=["Phi3ForCausalLM"], sliding_window=None,
              original_max_position_embeddings=cfg.original_max_position_embeddings or hf["max_position_embeddings"],
              partial_rotary_factor=cfg.partial_rotary_factor)
    for key in ("attention_bias", "mlp_bias"):
        hf.pop(key, None)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        f.write(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    fused = phi3_fuse(params, cfg)
    tl.save_safetensors_hf(os.path.join(out_dir, "model.safetensors"), fused, metadata={"format": "pt"})
    tokens, init, ref, grads, loss, ids, margin = first_batch_reference(
        out_dir, cfg, params, TOKENS_SEED + {"phi3": 3, "phi35": 5, "phi4mini": 6, "phi35_long": 7}[kind])
    ref.update({"grad." + n: _f32(g) for n, g in phi3_fuse(grads, cfg).items()})
    run = train_run(cfg, init, tokens, TRAIN)
    finals = phi3_fuse({n[len("final."):]: t for n, t in run.items() if n.startswith("final.")}, cfg)
    ref.update({n: t for n, t in run.items() if not n.startswith("final.")})
    ref.update({"final." + n: t for n, t in finals.items()})
    tg.save_safetensors(os.path.join(out_dir, "reference.safetensors"), ref,
                        metadata={"generator": "tools/make_llama_golden.py --only " + kind,
                                  "torch_version": torch.__version__, "seed": str(seed),
                                  "init_stds": json.dumps(stds), "train_args": json.dumps(TRAIN),
                                  "note": "input_ids/targets = batch 0 of tokens.bin with B=2 T=24; the Llama "
                                          "forward over the split weights"})
    if kind != "phi3":
        return {"loss0": float(loss), "losses": run["train_losses"].tolist(), "ids": ids, "margin": margin}
    base = {n: t.detach().clone() for n, t in fused.items()}
    fwd = phi3_forward_loss(cfg)
    lora = torch_lora.write_reference(out_dir, base, fwd, LORA_TRAIN, PHI3_LORA, "tools/make_llama_golden.py --only phi3")
    dropout = torch_lora.write_reference(out_dir, base, fwd, LORA_TRAIN, PHI3_LORA,
                                         "tools/make_llama_golden.py --only phi3", dropout=LORA_DROPOUT)
    return {"loss0": float(loss), "losses": run["train_losses"].tolist(), "ids": ids, "margin": margin,
            "lora_losses": lora["losses"], "dropout_losses": dropout["losses"], "tensors": lora["tensors"]}


def summarize(dirs):
    total = 0
    for d in dirs:
        for f in sorted(os.listdir(d)):
            p = os.path.join(d, f)
            sz = os.path.getsize(p)
            total += sz
            line = f"  {os.path.relpath(p, os.path.dirname(d)):48s} {sz:9d} B"
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
    ap.add_argument("--only", choices=["autocast", "zo", "lora", "long_rope", "qwen2", "qwen3", "mistral", "phi3", "phi35", "phi35_long",
                                       "phi4mini", "gemma", "gemma2", "gemma3"],
                    help="autocast: regenerate only tiny_llama/reference_bf16.safetensors; "
                         "zo: only tiny_llama/reference_zo.safetensors; "
                         "lora: only tiny_llama/{lora_init/,reference_lora*.safetensors,lora_args.json}; "
                         "long_rope: only long_rope/; qwen2: only tiny_qwen2/; qwen3: only tiny_qwen3/; mistral: only tiny_mistral/; "
                         "phi3: only tiny_phi3/; phi35: only tiny_phi35/; phi35_long: only tiny_phi35_long/; phi4mini: only tiny_phi4mini/; "
                         "gemma: only tiny_gemma/; gemma2: only "
                         "tiny_gemma2/; gemma3: only tiny_gemma3/")
    args = ap.parse_args()
    torch.set_num_threads(2)
    root = os.path.normpath(args.out)
    if args.only == "autocast":
        print(f"tiny_llama bf16 autocast: largest |bf16 - fp32| loss difference {make_autocast(root):.6f}")
        return
    if args.only == "zo":
        print(f"tiny_llama zo-sgd: projected gradients {[round(g, 4) for g in make_zo(root)]}")
        return
    if args.only == "lora":
        lo = make_lora(root)
        print(f"tiny_llama LoRA: losses {[round(v, 4) for v in lo['losses']]}, move {lo['largest_move']:.2e}")
        return
    if args.only in ("qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3"):
        q = make_qwen(root, args.only)
        print(f"tiny_{args.only}: loss0 {q['loss0']:.6f}, train losses {[round(v, 4) for v in q['losses']]}, "
              f"greedy -> {q['ids']} (min margin {q['margin']:.4f}); the variant moves the logits by "
              f"{q['moved']:.3f}; LoRA losses {[round(v, 4) for v in q['lora_losses']]}")
        return
    if args.only in ("phi35", "phi35_long", "phi4mini"):
        q = make_phi3(root, args.only)
        print(f"tiny_{args.only}: loss0 {q['loss0']:.6f}, train losses {[round(v, 4) for v in q['losses']]}, "
              f"greedy -> {q['ids']} (min margin {q['margin']:.4f})")
        return
    if args.only == "phi3":
        q = make_phi3(root)
        print(f"tiny_phi3: loss0 {q['loss0']:.6f}, train losses {[round(v, 4) for v in q['losses']]}, "
              f"greedy -> {q['ids']} (min margin {q['margin']:.4f}); LoRA ({q['tensors']} tensors) losses "
              f"{[round(v, 4) for v in q['lora_losses']]}, with dropout {[round(v, 4) for v in q['dropout_losses']]}")
        return
    if args.only == "long_rope":
        print(f"long_rope: logits at {LONG_POSITIONS}, spread {make_long_rope(root).std().item():.3f}")
        return
    info = make_tiny(root)
    make_long_rope(root)
    make_qwen(root, "qwen2")
    make_qwen(root, "qwen3")
    make_qwen(root, "mistral")
    make_qwen(root, "gemma")
    make_qwen(root, "gemma2")
    make_qwen(root, "gemma3")
    make_phi3(root)
    make_phi3(root, "phi35")
    make_phi3(root, "phi35_long")
    make_phi3(root, "phi4mini")
    lo = make_lora(root)
    print(f"tiny_llama LoRA: losses {[round(v, 4) for v in lo['losses']]}, move {lo['largest_move']:.2e}")
    print(f"tiny_llama zo-sgd: projected gradients {[round(g, 4) for g in make_zo(root)]}")
    print(f"tiny_llama bf16 autocast: largest |bf16 - fp32| loss difference {make_autocast(root):.6f}")
    print(f"tiny_llama: {info['n_params']} params, loss0 {info['loss0']:.6f}, "
          f"train losses {[round(v, 4) for v in info['losses']]}, "
          f"grad norms {[round(v, 4) for v in info['norms']]}")
    print(f"  greedy {PROMPT} -> {info['ids']} (min top-2 margin {info['margin']:.4f})")
    print(f"tiny_llama_bf16: loss {info['loss16']:.6f}, greedy -> {info['ids16']} "
          f"(min margin {info['margin16']:.4f})")
    for f, names in info["shards"].items():
        print(f"  {f}: {len(names)} tensors")
    total = summarize([os.path.join(root, "tiny_llama"), os.path.join(root, "tiny_llama_bf16")])
    assert total < 3 * 2**20, f"golden dirs too large: {total} B"


if __name__ == "__main__":
    main()
