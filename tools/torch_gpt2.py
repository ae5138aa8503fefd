"""Plain-PyTorch GPT-2 with Hugging Face semantics, plus the file formats and training rules
that Stratum's golden tests and benchmarks use as the reference.

What it does:
  - GPT-2 forward (== HF GPT2LMHeadModel in eval mode, all dropout off) over a dict of parameter
    tensors keyed by HF names with the `transformer.` prefix; tied LM head (logits = x @ wte^T);
    mean cross-entropy over all B*T positions.
  - Reference training step: sequential wrapping loader, LR schedule, global-norm clipping
    (torch.nn.utils.clip_grad_norm_), torch.optim.AdamW(foreach=False) with decay / no-decay groups.
  - A minimal safetensors writer/reader (struct + json, no `safetensors` package) and an HF
    config.json writer.
What it does not do: dropout, KV caching, generation, tokenization, mixed precision.

Run every script that imports this with Debian's PyTorch: /usr/bin/python3 (torch 1.13).
"""

import json
import math
import struct

import numpy as np
import torch


# ----------------------------------------------------------------------------------------------
# Config

class GPT2Config:
    def __init__(self, n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257,
                 layer_norm_epsilon=1e-5):
        assert n_embd % n_head == 0, "n_embd must be divisible by n_head"
        self.n_layer = n_layer
        self.n_head = n_head
        self.n_embd = n_embd
        self.n_positions = n_positions
        self.vocab_size = vocab_size
        self.layer_norm_epsilon = layer_norm_epsilon

    def to_hf_dict(self):
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_embd": self.n_embd,
            "n_positions": self.n_positions,
            "n_ctx": self.n_positions,
            "vocab_size": self.vocab_size,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "activation_function": "gelu_new",
            "tie_word_embeddings": True,
            "n_inner": None,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "bos_token_id": 50256,
            "eos_token_id": 50256,
            "initializer_range": 0.02,
            "scale_attn_weights": True,
            "torch_dtype": "float32",
        }


def write_hf_config(path, cfg):
    with open(path, "w") as f:
        json.dump(cfg.to_hf_dict(), f, indent=2, sort_keys=True)
        f.write("\n")


# ----------------------------------------------------------------------------------------------
# Parameters

def param_shapes(cfg):
    """Ordered {HF name (with `transformer.` prefix): shape}, in HF named_parameters() order."""
    C, V, P = cfg.n_embd, cfg.vocab_size, cfg.n_positions
    shapes = {
        "transformer.wte.weight": (V, C),
        "transformer.wpe.weight": (P, C),
    }
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        shapes[h + "ln_1.weight"] = (C,)
        shapes[h + "ln_1.bias"] = (C,)
        shapes[h + "attn.c_attn.weight"] = (C, 3 * C)   # Conv1D: (in, out)
        shapes[h + "attn.c_attn.bias"] = (3 * C,)
        shapes[h + "attn.c_proj.weight"] = (C, C)
        shapes[h + "attn.c_proj.bias"] = (C,)
        shapes[h + "ln_2.weight"] = (C,)
        shapes[h + "ln_2.bias"] = (C,)
        shapes[h + "mlp.c_fc.weight"] = (C, 4 * C)
        shapes[h + "mlp.c_fc.bias"] = (4 * C,)
        shapes[h + "mlp.c_proj.weight"] = (4 * C, C)
        shapes[h + "mlp.c_proj.bias"] = (C,)
    shapes["transformer.ln_f.weight"] = (C,)
    shapes["transformer.ln_f.bias"] = (C,)
    return shapes


def _is_layernorm(name):
    return ".ln_1." in name or ".ln_2." in name or ".ln_f." in name


def init_params(cfg, generator=None, ln_noise=True, bias_std=0.02, dtype=torch.float32):
    """Random parameters, drawn in param_shapes() order from `generator` (or the global RNG).

    Weights (dim >= 2): normal(0, 0.02); `*.c_proj.weight`: normal(0, 0.02/sqrt(2*n_layer)).
    Biases: normal(0, bias_std). LayerNorm: with ln_noise, weight = 1 + 0.1*normal and
    bias = 0.02*normal (deliberately non-trivial for golden tests); else weight 1, bias 0.
    """
    params = {}
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, shape in param_shapes(cfg).items():
        if _is_layernorm(name):
            if ln_noise:
                r = torch.randn(shape, generator=generator, dtype=torch.float32)
                t = 1.0 + 0.1 * r if name.endswith(".weight") else 0.02 * r
            else:
                t = torch.ones(shape) if name.endswith(".weight") else torch.zeros(shape)
        elif len(shape) >= 2:
            std = proj_std if name.endswith("c_proj.weight") else 0.02
            t = torch.randn(shape, generator=generator, dtype=torch.float32) * std
        else:
            t = torch.randn(shape, generator=generator, dtype=torch.float32) * bias_std
        params[name] = t.to(dtype).contiguous()
    return params


# ----------------------------------------------------------------------------------------------
# Model

def gelu_new(x):
    """HF "gelu_new": 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def conv1d(x, w, b):
    """HF Conv1D: w is (in, out); y = x @ w + b."""
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[-1])


def layer_norm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def attention_core(qkv, n_head):
    """qkv (B,T,3C) as produced by c_attn -> (B,T,C): heads merged, before c_proj.

    Split q,k,v in that order; heads = reshape (B,T,H,hd) -> (B,H,T,hd); causal mask;
    softmax(q k^T / sqrt(hd)) v. Same arithmetic as HF GPT2Attention._attn.
    """
    B, T, C3 = qkv.shape
    C = C3 // 3
    hd = C // n_head
    q, k, v = qkv.split(C, dim=2)
    q = q.reshape(B, T, n_head, hd).permute(0, 2, 1, 3)
    k = k.reshape(B, T, n_head, hd).permute(0, 2, 1, 3)
    v = v.reshape(B, T, n_head, hd).permute(0, 2, 1, 3)
    att = torch.matmul(q, k.transpose(-1, -2))
    att = att / torch.full([], hd ** 0.5, dtype=att.dtype)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    att = torch.where(causal, att, torch.tensor(torch.finfo(att.dtype).min, dtype=att.dtype))
    att = torch.softmax(att, dim=-1)
    y = torch.matmul(att, v)                      # (B,H,T,hd)
    return y.permute(0, 2, 1, 3).reshape(B, T, C)


def forward(params, cfg, idx, targets=None, adapter=None):
    """idx (B,T) int64 -> logits (B,T,V); with targets (B,T) also mean cross-entropy loss.

    adapter(module, x, y) -> y': applied to each block linear's output y (module its HF name, e.g.
    "transformer.h.0.attn.c_attn", x its input): LoRA (tools/torch_lora.py); None = none."""
    B, T = idx.shape
    assert T <= cfg.n_positions, f"sequence {T} exceeds n_positions {cfg.n_positions}"
    eps = cfg.layer_norm_epsilon
    p = params
    wte = p["transformer.wte.weight"]
    pos = torch.arange(T, dtype=torch.long)
    x = wte[idx] + p["transformer.wpe.weight"][pos].unsqueeze(0)   # (B,T,C)
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        a = layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
        def lin(module, v):
            y = conv1d(v, p[h + module + ".weight"], p[h + module + ".bias"])
            return y if adapter is None else adapter(h + module, v, y)
        qkv = lin("attn.c_attn", a)
        a = attention_core(qkv, cfg.n_head)
        x = x + lin("attn.c_proj", a)
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
        m = gelu_new(lin("mlp.c_fc", m))
        x = x + lin("mlp.c_proj", m)
    x = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    logits = torch.matmul(x, wte.t())             # tied head, (B,T,V)
    if targets is None:
        return logits, None
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1), reduction="mean")
    return logits, loss


# ----------------------------------------------------------------------------------------------
# Training semantics (Stratum matches these; see tools/README.md)

def get_batch(tokens, k, B, T):
    """Sequential wrapping loader. tokens: 1-D int64 tensor of N ids.

    Batch k uses tokens[(k*B*T + j) mod N] for j in [0, B*T]; inputs = first B*T as (B,T),
    targets = the same window shifted by one.
    """
    n = tokens.numel()
    start = k * B * T
    ix = (torch.arange(B * T + 1, dtype=torch.long) + start) % n
    buf = tokens[ix]
    return buf[:-1].reshape(B, T).clone(), buf[1:].reshape(B, T).clone()


def lr_at(step, max_lr, warmup, min_lr, total_steps, schedule="cosine"):
    """LR for 0-based `step` (python float, computed in double)."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if schedule == "constant":
        return max_lr
    if schedule != "cosine":
        raise ValueError(f"unknown lr schedule {schedule!r} (expected 'cosine' or 'constant')")
    progress = (step - warmup) / max(1, total_steps - warmup)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(params, lr, beta1, beta2, eps, weight_decay):
    """AdamW(foreach=False); group 0 = every param with dim >= 2 (decayed), group 1 = the rest."""
    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps, foreach=False)


def grad_norm_and_clip(params, clip):
    """Pre-clip global L2 norm (torch.nn.utils.clip_grad_norm_); clip <= 0 = measure only."""
    plist = list(params.values())
    if clip > 0:
        return float(torch.nn.utils.clip_grad_norm_(plist, clip))
    grads = [t.grad for t in plist if t.grad is not None]
    return float(torch.norm(torch.stack([torch.norm(g.detach(), 2.0) for g in grads]), 2.0))


def train_step(params, cfg, opt, tokens, step, B, T, lr, clip, autocast=False):
    """One step: batch `step`, forward, backward, clip, set lr, AdamW. Returns (loss, norm).

    autocast: the forward under torch.autocast("cpu", dtype=torch.bfloat16) (matrix products in
    bf16; parameters, gradients and AdamW stay fp32), as Stratum's --precision bf16."""
    for t in params.values():
        t.grad = None
    x, y = get_batch(tokens, step, B, T)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        _, loss = forward(params, cfg, x, y)
    loss = loss.float()
    loss.backward()
    norm = grad_norm_and_clip(params, clip)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return float(loss.detach()), norm


# ----------------------------------------------------------------------------------------------
# safetensors (pure Python)

_NP_BY_DTYPE = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8, "BOOL": np.bool_,
}
_DTYPE_BY_NP = {np.dtype(v).str.lstrip("<>|="): k for k, v in _NP_BY_DTYPE.items()}


def _to_numpy(t):
    if isinstance(t, torch.Tensor):
        if t.dtype == torch.bfloat16:
            return "BF16", t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)
        t = t.detach().contiguous().numpy()
    a = np.ascontiguousarray(t)
    key = a.dtype.str.lstrip("<>|=")
    if key not in _DTYPE_BY_NP:
        raise ValueError(f"[safetensors] unsupported dtype {a.dtype}")
    return _DTYPE_BY_NP[key], a


def save_safetensors(path, tensors, metadata=None):
    """tensors: ordered {name: torch.Tensor | np.ndarray}; data laid out in that order.

    Layout: u64 LE header length N; N bytes of JSON (padded with spaces to a multiple of 8);
    then the little-endian data; data_offsets are relative to the end of the header.
    """
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        dtype, a = _to_numpy(t)
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in blobs:
            f.write(raw)


def load_safetensors(path):
    """Returns ({name: torch.Tensor}, metadata dict). BF16 comes back as torch.bfloat16."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        raw = data[base + b: base + e]
        if info["dtype"] == "BF16":
            a = np.frombuffer(raw, dtype="<u2").copy().reshape(shape)
            out[name] = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        else:
            npdt = np.dtype(_NP_BY_DTYPE[info["dtype"]]).newbyteorder("<")
            a = np.frombuffer(raw, dtype=npdt).astype(npdt.newbyteorder("="), copy=True)
            out[name] = torch.from_numpy(a.reshape(shape))
    return out, meta
