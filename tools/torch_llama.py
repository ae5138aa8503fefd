"""Plain-PyTorch Llama with Hugging Face `LlamaForCausalLM` semantics (fp32, eval mode), plus the
llama3 RoPE tables, greedy generation, a reference training step and the sharded safetensors
layout that `save_pretrained` writes. Stratum's Llama golden tests use it as the reference.

What it does:
  - Llama forward over a dict of parameter tensors keyed by HF names (`model.` prefix,
    `lm_head.weight` untied): token embedding; per layer RMSNorm -> q/k/v projections (nn.Linear
    without bias, weights (out, in)) -> rotary embedding (rotate-half convention, cos/sin in fp32
    from inv_freq exactly as transformers computes it, llama3 scaling included) -> grouped-query
    causal attention (repeat_kv, scale 1/sqrt(head_dim)) -> o_proj -> residual; RMSNorm ->
    SwiGLU MLP down(silu(gate(x)) * up(x)) -> residual; final RMSNorm; lm_head; mean
    cross-entropy over explicit targets (like torch_gpt2.forward, no internal shift).
  - Greedy generation by recomputing the full forward each step (argmax, lowest id on ties).
  - Reference training step: the same loader, LR schedule, clipping and AdamW groups as
    torch_gpt2 (those helpers are reused, not copied).
  - safetensors writing in the layout of the Rust `safetensors` library (the one transformers
    uses): `__metadata__` first, tensors sorted by name; sharding like huggingface_hub's
    split_torch_state_dict_into_shards plus the `model.safetensors.index.json` transformers writes.
With model_type "qwen2" the q, k and v projections have biases (Qwen2ForCausalLM); with
"qwen3" each query and key head is RMSNorm'd (q_norm, k_norm: one (head_dim) weight each) before
the rotary embedding (Qwen3ForCausalLM's Qwen3Attention); with "gemma" (GemmaForCausalLM) every
RMSNorm multiplies by (1 + w), the MLP is GeGLU (gelu_pytorch_tanh(gate) * up), the embedding rows
are multiplied by sqrt(hidden_size) (as a tensor of the embedding's dtype) and the LM head is tied.
A tied model (tie_word_embeddings) has no lm_head.weight: the head reads model.embed_tokens.weight.
With "gemma3_text" (Gemma3ForCausalLM) a Gemma also norms each query and key head (q_norm, k_norm,
by 1 + w) before the rope, norms the attention's and the MLP's outputs before their residual adds
(post_attention_layernorm, post_feedforward_layernorm; the MLP's input norm is then
pre_feedforward_layernorm), scales scores by query_pre_attn_scalar^-1/2, and its sliding layers
(layer_types) use rope_local_base_freq unscaled and attend to the last sliding_window keys.
With "gemma2" (Gemma2ForCausalLM) a Gemma has Gemma 3's post norms and sliding layers (one rope,
no q/k norms) and soft-caps: each scaled score at attn_logit_softcapping * tanh(s / cap) before the
mask, each logit at final_logit_softcapping * tanh(l / cap) (transformers' Gemma2: divide, tanh,
multiply).
With "mistral" (MistralForCausalLM) a Llama attends, in every layer, to the last sliding_window keys.
What it does not do: KV caching, sampling, o_proj/MLP biases, rope types other than
"default" and "llama3", bf16 arithmetic (bf16 weights are upcast and computed in fp32).

Run every script that imports this with Debian's PyTorch: /usr/bin/python3 (torch 1.13).
"""

import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2 as tg  # noqa: E402


# ----------------------------------------------------------------------------------------------
# Config

class LlamaConfig:
    def __init__(self, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=None,
                 max_position_embeddings=64, vocab_size=131, rms_norm_eps=1e-5,
                 rope_theta=500000.0, rope_scaling=None, tie_word_embeddings=False,
                 bos_token_id=1, eos_token_id=2, model_type="llama", sliding_window=None,
                 layer_types=None, rope_local_base_freq=10000.0, query_pre_attn_scalar=None,
                 original_max_position_embeddings=None, attn_logit_softcapping=None,
                 final_logit_softcapping=None, partial_rotary_factor=1.0):
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.vocab_size = vocab_size
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.tie_word_embeddings = tie_word_embeddings
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        assert model_type in ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text"), model_type
        self.partial_rotary_factor = partial_rotary_factor  # Phi-4-mini's: the rope turns int(hd * f) channels
        self.rotary_dim = int(self.head_dim * partial_rotary_factor)
        self.attn_logit_softcapping = attn_logit_softcapping    # gemma2's soft-capping
        self.final_logit_softcapping = final_logit_softcapping
        # mistral: a sliding window in every layer; gemma2, gemma3_text: their sliding layers'
        # window, layer types, local rope base and score scale
        self.original_max_position_embeddings = original_max_position_embeddings  # Phi-3's longrope base
        self.sliding_window = sliding_window
        self.layer_types = layer_types
        self.rope_local_base_freq = rope_local_base_freq
        self.query_pre_attn_scalar = query_pre_attn_scalar if query_pre_attn_scalar is not None else self.head_dim
        # qwen2: q_proj, k_proj and v_proj have biases (Qwen2Attention); qwen3: q_norm, k_norm;
        # gemma: norms by 1 + w, GeGLU, scaled embedding (GemmaModel)
        self.model_type = model_type
        assert num_attention_heads % num_key_value_heads == 0, \
            "num_attention_heads must be a multiple of num_key_value_heads"

    @property
    def norm_offset(self):
        """What every RMSNorm adds to its weight: Gemma's 1 (GemmaRMSNorm), else 0."""
        return 1.0 if self.gemma else 0.0

    @property
    def gemma(self):
        return self.model_type in ("gemma", "gemma2", "gemma3_text")

    @property
    def post_norms(self):
        """Gemma 2's and 3's norms of the attention's and the MLP's outputs."""
        return self.model_type in ("gemma2", "gemma3_text")

    def layer_window(self, i):
        """Layer i's sliding window (keys j with i - j < window), or None: every layer of a Mistral
        with one (MistralAttention), Gemma 2's and 3's sliding layers."""
        if self.post_norms:
            return self.sliding_window if self.layer_types[i] == "sliding_attention" else None
        return self.sliding_window if self.model_type == "mistral" else None

    @property
    def gemma3(self):
        return self.model_type == "gemma3_text"

    def to_hf_dict(self, torch_dtype="float32"):
        qwen = self.model_type in ("qwen2", "qwen3")
        arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM",
                "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                "mistral": "MistralForCausalLM"}.get(self.model_type,
                                                                                       "LlamaForCausalLM")
        d = {
            "architectures": [arch],
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "hidden_act": "silu",
            "torch_dtype": torch_dtype,
        }
        if self.model_type == "qwen3":  # Qwen3Config's attention_bias (q_norm, k_norm come with the type)
            d.update(attention_bias=False)
        if qwen:  # Qwen2Config: no attention_bias (its q, k, v biases come with the type)
            d.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers)
        elif self.gemma:  # GemmaConfig: the activation under both names
            d.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", attention_bias=False)
            if self.gemma3:  # Gemma3TextConfig's
                d.update(sliding_window=self.sliding_window, layer_types=self.layer_types,
                         rope_local_base_freq=self.rope_local_base_freq,
                         query_pre_attn_scalar=self.query_pre_attn_scalar, final_logit_softcapping=None,
                         attn_logit_softcapping=None)
            if self.model_type == "gemma2":  # Gemma2Config's
                d.update(sliding_window=self.sliding_window, layer_types=self.layer_types,
                         query_pre_attn_scalar=self.query_pre_attn_scalar,
                         final_logit_softcapping=self.final_logit_softcapping,
                         attn_logit_softcapping=self.attn_logit_softcapping)
        elif self.model_type == "mistral":  # MistralConfig: no bias fields, its window
            d.update(sliding_window=self.sliding_window)
        else:
            d.update(attention_bias=False, mlp_bias=False)
        return d


def write_hf_config(path, cfg, torch_dtype="float32"):
    """Like transformers' PretrainedConfig.to_json_file: indent 2, sorted keys, final newline."""
    with open(path, "w") as f:
        f.write(json.dumps(cfg.to_hf_dict(torch_dtype), indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------------
# Parameters

def param_shapes(cfg):
    """Ordered {HF name: shape}, in LlamaForCausalLM.named_parameters() order."""
    C, V, I = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    q_out = cfg.num_attention_heads * cfg.head_dim
    kv_out = cfg.num_key_value_heads * cfg.head_dim
    shapes = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg.num_hidden_layers):
        h = f"model.layers.{i}."
        shapes[h + "self_attn.q_proj.weight"] = (q_out, C)     # nn.Linear: (out, in)
        if cfg.model_type == "qwen2":
            shapes[h + "self_attn.q_proj.bias"] = (q_out,)
        shapes[h + "self_attn.k_proj.weight"] = (kv_out, C)
        if cfg.model_type == "qwen2":
            shapes[h + "self_attn.k_proj.bias"] = (kv_out,)
        shapes[h + "self_attn.v_proj.weight"] = (kv_out, C)
        if cfg.model_type == "qwen2":
            shapes[h + "self_attn.v_proj.bias"] = (kv_out,)
        shapes[h + "self_attn.o_proj.weight"] = (C, q_out)
        if cfg.model_type in ("qwen3", "gemma3_text"):
            shapes[h + "self_attn.q_norm.weight"] = (cfg.head_dim,)
            shapes[h + "self_attn.k_norm.weight"] = (cfg.head_dim,)
        shapes[h + "mlp.gate_proj.weight"] = (I, C)
        shapes[h + "mlp.up_proj.weight"] = (I, C)
        shapes[h + "mlp.down_proj.weight"] = (C, I)
        shapes[h + "input_layernorm.weight"] = (C,)
        shapes[h + "post_attention_layernorm.weight"] = (C,)
        if cfg.post_norms:  # the MLP's input norm, and its output's
            shapes[h + "pre_feedforward_layernorm.weight"] = (C,)
            shapes[h + "post_feedforward_layernorm.weight"] = (C,)
    shapes["model.norm.weight"] = (C,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, C)
    return shapes


def init_params(cfg, generator, stds):
    """Random parameters drawn in param_shapes() order from `generator`.

    `stds` maps a name suffix (e.g. "q_proj.weight", "embed_tokens.weight") to the normal std of
    that matrix. Norm weights (1-D) are 1 + 0.1*normal (as the norm applies them: Gemma's stored
    w is then 0.1*normal), so a wrong norm cannot go unnoticed; biases (Qwen2's) are normal with
    std stds["bias"].
    """
    params = {}
    for name, shape in param_shapes(cfg).items():
        r = torch.randn(shape, generator=generator, dtype=torch.float32)
        if name.endswith(".bias"):
            t = r * stds["bias"]
        elif len(shape) == 1:
            t = 1.0 - cfg.norm_offset + 0.1 * r
        else:
            key = [k for k in stds if name.endswith(k)]
            assert len(key) == 1, f"bug: no unique std for {name}"
            t = r * stds[key[0]]
        params[name] = t.contiguous()
    return params


# ----------------------------------------------------------------------------------------------
# Rotary embedding (transformers modeling_rope_utils + LlamaRotaryEmbedding.forward)

def rope_inv_freq_default(theta, head_dim):
    """_compute_default_rope_parameters: 1/(theta ** (arange(0, hd, 2).float()/hd)), fp32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_inv_freq_llama3(inv_freq, factor, low_freq_factor, high_freq_factor, old_context_len):
    """_compute_llama3_parameters applied to fp32 inv_freq, op for op (so fp32 rounding matches)."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = ((old_context_len / wavelen - low_freq_factor)
                     / (high_freq_factor - low_freq_factor))
    smoothed_inv_freq = ((1 - smooth_factor) * inv_freq_llama / factor
                         + smooth_factor * inv_freq_llama)
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_inv_freq(cfg, seq_len=None):
    """(head_dim/2,) fp32 inv_freq for cfg.rope_scaling None / "default" / "linear" / "llama3" /
    "longrope" (its long factors for a forward of seq_len > original_max_position_embeddings
    positions, as transformers' _longrope_frequency_update switches them, else its short ones)."""
    inv = rope_inv_freq_default(cfg.rope_theta, cfg.rotary_dim)
    rs = cfg.rope_scaling
    kind = None if rs is None else rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv
    if kind == "linear":  # _compute_linear_scaling_rope_parameters
        return inv / rs["factor"]
    if kind in ("longrope", "su"):  # _compute_longrope_parameters
        original = cfg.original_max_position_embeddings or cfg.max_position_embeddings
        factors = rs["long_factor"] if seq_len is not None and seq_len > original else rs["short_factor"]
        shape = torch.arange(0, cfg.rotary_dim, 2, dtype=torch.int64).float() / cfg.rotary_dim
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * cfg.rope_theta ** shape)
    if kind != "llama3":
        raise ValueError(f"rope_type {kind!r} not implemented in this reference")
    return rope_inv_freq_llama3(inv, rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
                                rs["original_max_position_embeddings"])


def rope_attention_scaling(cfg):
    """The factor cos and sin are multiplied by: longrope's (attention_factor, else from
    max_position_embeddings / original_max_position_embeddings as Phi-3 computes it), else 1."""
    rs = cfg.rope_scaling
    if rs is None or rs.get("rope_type", rs.get("type")) not in ("longrope", "su"):
        return 1.0
    if rs.get("attention_factor") is not None:
        return rs["attention_factor"]
    original = cfg.original_max_position_embeddings or cfg.max_position_embeddings
    factor = cfg.max_position_embeddings / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def rope_cos_sin(inv_freq, position_ids):
    """position_ids (B,T) int64 -> cos, sin (B,T,hd) fp32, as LlamaRotaryEmbedding.forward:
    freqs = (inv_freq[None,:,None] @ pos[:,None,:].float()).transpose(1,2); emb = cat(freqs,freqs).
    attention_scaling is 1.0 for default and llama3 rope, so it is left out."""
    B = position_ids.shape[0]
    inv = inv_freq[None, :, None].float().expand(B, -1, 1)
    pos = position_ids[:, None, :].float()
    freqs = (inv @ pos).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """x (B,H,T,hd); cos, sin (B,T,rd) -> x*cos + rotate_half(x)*sin over the first rd channels,
    the rest passed through (Phi3's partial rotary: rd = cos.shape[-1] < hd)."""
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)
    cos = cos.unsqueeze(1).to(x.dtype)
    sin = sin.unsqueeze(1).to(x.dtype)
    return (x * cos) + (rotate_half(x) * sin)


# ----------------------------------------------------------------------------------------------
# Model

def rms_norm(x, w, eps, offset=0.0):
    """LlamaRMSNorm: w * (x * rsqrt(mean(x^2) + eps)); with offset 1 GemmaRMSNorm's
    (x * rsqrt(mean(x^2) + eps)) * (1.0 + w)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    if offset:
        return (x * torch.rsqrt(variance + eps)) * (offset + w)
    return w * (x * torch.rsqrt(variance + eps))


def repeat_kv(x, n_rep):
    """(B, KV, T, hd) -> (B, KV*n_rep, T, hd); query head h reads kv head h // n_rep."""
    B, KV, T, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, KV, n_rep, T, hd).reshape(B, KV * n_rep, T, hd)


def attention(h, p, pre, cfg, cos, sin, adapter=None, window=None):
    """Self-attention of layer `pre` (HF LlamaAttention, eager) on normed input h (B,T,C);
    window: a query attends to that many keys at most (itself and the ones before it); Gemma 2's
    scores soft-capped by cfg.attn_logit_softcapping."""
    B, T, _ = h.shape
    H, KV, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    lin = _linear(p, pre, adapter)
    q = lin("self_attn.q_proj", h).view(B, T, H, hd)
    k = lin("self_attn.k_proj", h).view(B, T, KV, hd)
    if pre + "self_attn.q_norm.weight" in p:  # Qwen3: per-head RMSNorm before the rope
        q = rms_norm(q, p[pre + "self_attn.q_norm.weight"], cfg.rms_norm_eps, cfg.norm_offset)
        k = rms_norm(k, p[pre + "self_attn.k_norm.weight"], cfg.rms_norm_eps, cfg.norm_offset)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = lin("self_attn.v_proj", h).view(B, T, KV, hd).transpose(1, 2)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    k = repeat_kv(k, H // KV)
    v = repeat_kv(v, H // KV)
    att = torch.matmul(q, k.transpose(2, 3)) * (cfg.query_pre_attn_scalar ** -0.5)  # (B,H,T,T)
    if cfg.attn_logit_softcapping is not None:  # Gemma2Attention's
        att = torch.tanh(att / cfg.attn_logit_softcapping) * cfg.attn_logit_softcapping
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    if window is not None:  # Mistral's layers, Gemma 2's and 3's sliding ones: keys j with i - j < window
        causal = causal & torch.ones(T, T, dtype=torch.bool).triu(-(window - 1))
    att = torch.where(causal, att, torch.tensor(torch.finfo(att.dtype).min, dtype=att.dtype))
    att = torch.softmax(att, dim=-1)
    y = torch.matmul(att, v)                                            # (B,H,T,hd)
    y = y.transpose(1, 2).reshape(B, T, H * hd)
    return lin("self_attn.o_proj", y)


def _linear(p, pre, adapter):
    """module, x -> x @ W^T (+ its bias, Qwen2's q/k/v) of layer `pre`'s module, then
    adapter(HF module name, x, y) if given."""
    def lin(module, x):
        y = torch.nn.functional.linear(x, p[pre + module + ".weight"], p.get(pre + module + ".bias"))
        return y if adapter is None else adapter(pre + module, x, y)
    return lin


def mlp(h, p, pre, adapter=None, gelu=False):
    """down(silu(gate(h)) * up(h)); gelu: Gemma's down(gelu_tanh(gate(h)) * up(h))."""
    lin = _linear(p, pre, adapter)
    gate = lin("mlp.gate_proj", h)
    act = torch.nn.functional.gelu(gate, approximate="tanh") if gelu else torch.nn.functional.silu(gate)
    return lin("mlp.down_proj", act * lin("mlp.up_proj", h))


def forward(params, cfg, idx, targets=None, inv_freq=None, adapter=None):
    """idx (B,T) int64 -> logits (B,T,V); with targets (B,T) also the mean cross-entropy loss.
    adapter(module, x, y) -> y': applied to each block linear's output (as torch_gpt2.forward).

    Positions are 0..T-1 for every row. Parameters may be bf16: they are upcast to the compute
    dtype of the embedding's float type (fp32 for bf16 weights)."""
    p = {n: (t.float() if t.dtype == torch.bfloat16 else t) for n, t in params.items()}
    B, T = idx.shape
    assert T <= cfg.max_position_embeddings, \
        f"sequence {T} exceeds max_position_embeddings {cfg.max_position_embeddings}"
    eps = cfg.rms_norm_eps
    if inv_freq is None:
        inv_freq = rope_inv_freq(cfg, T)  # seq_len: the forward's max position + 1
    pos = torch.arange(T, dtype=torch.int64).unsqueeze(0).expand(B, T)
    cos, sin = rope_cos_sin(inv_freq, pos)
    scaling = rope_attention_scaling(cfg)
    if scaling != 1.0:  # longrope: emb.cos() * attention_scaling
        cos, sin = cos * scaling, sin * scaling
    x = p["model.embed_tokens.weight"][idx]                             # (B,T,C)
    gemma = cfg.gemma
    if gemma:  # GemmaModel's normalizer, a tensor of the hidden states' dtype
        x = x * torch.tensor(cfg.hidden_size ** 0.5, dtype=x.dtype)
    off = cfg.norm_offset
    if cfg.gemma3:  # the sliding layers' rope: rope_local_base_freq, no scaling
        cos_l, sin_l = rope_cos_sin(rope_inv_freq_default(cfg.rope_local_base_freq, cfg.head_dim), pos)
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        window = cfg.layer_window(i)
        local = window is not None and cfg.gemma3  # Gemma 3's sliding layers' own rope
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps, off)
        a = attention(h, p, pre, cfg, cos_l if local else cos, sin_l if local else sin, adapter, window)
        if cfg.post_norms:
            a = rms_norm(a, p[pre + "post_attention_layernorm.weight"], eps, off)
        x = x + a
        norm2 = "pre_feedforward_layernorm.weight" if cfg.post_norms else "post_attention_layernorm.weight"
        m = mlp(rms_norm(x, p[pre + norm2], eps, off), p, pre, adapter, gemma)
        if cfg.post_norms:
            m = rms_norm(m, p[pre + "post_feedforward_layernorm.weight"], eps, off)
        x = x + m
    x = rms_norm(x, p["model.norm.weight"], eps, off)
    head = p["lm_head.weight"] if "lm_head.weight" in p else p["model.embed_tokens.weight"]  # tied
    logits = torch.nn.functional.linear(x, head)                        # (B,T,V)
    if cfg.final_logit_softcapping is not None:  # Gemma2ForCausalLM's
        logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
    if targets is None:
        return logits, None
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1), reduction="mean")
    return logits, loss


def argmax_lowest(v):
    """Index of the maximum of 1-D v; the lowest index among equal maxima."""
    m = v.max()
    return int(torch.nonzero(v == m)[0, 0])


@torch.no_grad()
def greedy_generate(params, cfg, prompt, n_new):
    """Recomputes the full forward for each new token. Returns (new ids, (n_new,V) logits of the
    last position at each step, min top1-top2 margin)."""
    ids = list(prompt)
    out, step_logits, margin = [], [], float("inf")
    for _ in range(n_new):
        logits, _ = forward(params, cfg, torch.tensor([ids], dtype=torch.int64))
        last = logits[0, -1]
        nxt = argmax_lowest(last)
        top2 = torch.topk(last, 2).values
        margin = min(margin, float(top2[0] - top2[1]))
        out.append(nxt)
        step_logits.append(last.clone())
        ids.append(nxt)
    return out, torch.stack(step_logits), margin


# ----------------------------------------------------------------------------------------------
# Training (same semantics as torch_gpt2; see tools/README.md)

def train_step(params, cfg, opt, tokens, step, B, T, lr, clip, autocast=False):
    """One step: batch `step`, forward, backward, clip, set lr, AdamW. Returns (loss, norm).
    autocast: the forward under CPU autocast to bfloat16 (as torch_gpt2.train_step)."""
    for t in params.values():
        t.grad = None
    x, y = tg.get_batch(tokens, step, B, T)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        _, loss = forward(params, cfg, x, y)
    loss = loss.float()
    loss.backward()
    norm = tg.grad_norm_and_clip(params, clip)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return float(loss.detach()), norm


# ----------------------------------------------------------------------------------------------
# safetensors as transformers writes them

def save_safetensors_hf(path, tensors, metadata=None):
    """Layout of the Rust `safetensors` serializer (what save_pretrained uses): data sorted by
    (dtype alignment descending, name), header JSON compact with `__metadata__` first and the
    tensors in data order, padded with spaces to a multiple of 8."""
    align = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2,
             "I8": 1, "U8": 1, "BOOL": 1}
    items = []
    for name, t in tensors.items():
        dtype, a = tg._to_numpy(t)
        items.append((name, dtype, a))
    items.sort(key=lambda it: (-align[it[1]], it[0]))
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name, dtype, a in items:
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in blobs:
            f.write(raw)


def split_into_shards(state_dict, max_shard_size_bytes):
    """huggingface_hub.split_torch_state_dict_into_shards: walk tensors in state_dict order,
    start a new shard when the next tensor would push the current one past the limit; a tensor
    larger than the limit gets a shard of its own. Returns (list of {name: tensor}, total bytes)."""
    shards, cur, cur_size, total = [], {}, 0, 0
    for name, t in state_dict.items():
        size = t.numel() * t.element_size()
        if size > max_shard_size_bytes:
            shards.append({name: t})
            total += size
            continue
        if cur_size + size > max_shard_size_bytes:
            shards.append(cur)
            cur, cur_size = {}, 0
        cur[name] = t
        cur_size += size
        total += size
    if cur:
        shards.append(cur)
    return shards, total


def save_sharded(out_dir, state_dict, max_shard_size_bytes):
    """model-0000k-of-0000n.safetensors + model.safetensors.index.json as save_pretrained writes
    them (index: {"metadata": {"total_size": bytes of tensor data}, "weight_map": {name: file}},
    indent 2, sorted keys). Returns the shard file names."""
    shards, total = split_into_shards(state_dict, max_shard_size_bytes)
    n = len(shards)
    assert n > 1, "bug: expected more than one shard"
    weight_map, files = {}, []
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        save_safetensors_hf(os.path.join(out_dir, fname), shard, metadata={"format": "pt"})
        files.append(fname)
        for name in shard:
            weight_map[name] = fname
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return files
