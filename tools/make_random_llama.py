#!/usr/bin/env python3
"""Writes a random-weight Llama-family model in the Hugging Face layout (numpy only, no torch).

Output: DIR/config.json (LlamaForCausalLM, written last, so a directory without it is incomplete)
and DIR/model.safetensors, or, when the weights pass --shard-mib, model-0000k-of-0000n.safetensors
shards plus model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": ...}),
as save_pretrained lays them out (tensors in LlamaForCausalLM.named_parameters() order, a new shard
when the next tensor would push the current one past the limit).
Weights: normal(0, 0.02), RMSNorm weights 1.0; fp32, or bf16 rounded to nearest even from the
fp32 values. It generates each tensor in fixed chunks of 4Mi values, chunk k of tensor t from
numpy's default_rng([seed, t, k]), on --threads threads, and writes chunk by chunk, so memory
stays at a few chunks whatever the model size and the bytes depend only on shape, dtype and seed.
It is not a trained model: greedy output is noise, but it is a valid, loadable one.

Usage: /usr/bin/python3 tools/make_random_llama.py --out DIR [--preset 1b|tiny] [--dtype fp32|bf16]
           [--layers N] [--hidden C] [--inter I] [--heads H] [--kv-heads KV] [--vocab V] [--ctx T]
           [--seed 1234] [--shard-mib 2000] [--threads 2]
Presets: 1b = TinyLlama-1.1B shape (C2048 I5632 L22 H32 KV4 V32000 ctx 2048, rope_theta 1e4, untied);
tiny = C256 I688 L4 H8 KV2 V2048 ctx 512.
"""
import argparse, concurrent.futures, json, os, struct, sys, time

import numpy as np

PRESETS = {
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=2048, max_position_embeddings=512),
}
CHUNK_VALUES = 1 << 22  # values per generated chunk (16 MiB of fp32); part of the output's definition
STD = 0.02
DTYPES = {"fp32": ("F32", "float32", 4), "bf16": ("BF16", "bfloat16", 2)}


def make_config(preset="tiny", dtype="fp32", layers=None, hidden=None, inter=None, heads=None, kv_heads=None,
                vocab=None, ctx=None):
    """The config.json dict for a preset with optional overrides."""
    c = dict(PRESETS[preset])
    for key, value in [("num_hidden_layers", layers), ("hidden_size", hidden), ("intermediate_size", inter),
                       ("num_attention_heads", heads), ("num_key_value_heads", kv_heads), ("vocab_size", vocab),
                       ("max_position_embeddings", ctx)]:
        if value is not None:
            c[key] = value
    if c["hidden_size"] % c["num_attention_heads"] or c["num_attention_heads"] % c["num_key_value_heads"]:
        sys.exit(f"make_random_llama: hidden {c['hidden_size']} must be a multiple of heads "
                 f"{c['num_attention_heads']}, and heads a multiple of kv-heads {c['num_key_value_heads']}")
    c.update({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "head_dim": c["hidden_size"] // c["num_attention_heads"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_scaling": None, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": DTYPES[dtype][1],
    })
    return dict(sorted(c.items()))


def param_shapes(c):
    """[(HF name, shape, is_norm)] in LlamaForCausalLM.named_parameters() order."""
    C, I, V, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    out = [("model.embed_tokens.weight", (V, C), False)]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (H * hd, C), False),
                (p + "self_attn.k_proj.weight", (KV * hd, C), False),
                (p + "self_attn.v_proj.weight", (KV * hd, C), False),
                (p + "self_attn.o_proj.weight", (C, H * hd), False),
                (p + "mlp.gate_proj.weight", (I, C), False), (p + "mlp.up_proj.weight", (I, C), False),
                (p + "mlp.down_proj.weight", (C, I), False), (p + "input_layernorm.weight", (C,), True),
                (p + "post_attention_layernorm.weight", (C,), True)]
    out.append(("model.norm.weight", (C,), True))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C), False))
    return out


def param_count(c):
    return sum(int(np.prod(shape)) for _, shape, _ in param_shapes(c))


def numel(shape):
    return int(np.prod(shape))


def plan_shards(tensors, elem_bytes, shard_bytes):
    """huggingface_hub's split: a new shard when the next tensor would pass the limit."""
    shards, cur, cur_bytes = [], [], 0
    for t in tensors:
        size = numel(t[1]) * elem_bytes
        if cur and cur_bytes + size > shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += size
    if cur:
        shards.append(cur)
    return shards


def chunk_values(seed, tensor_index, chunk_index, n, is_norm, dtype):
    """Values [chunk_index * CHUNK_VALUES, + n) of tensor tensor_index: a little-endian array,
    float32 or bf16 bits as uint16 (numpy releases the GIL here, so chunks run in parallel)."""
    x = np.empty(n, np.float32)
    if is_norm:
        x.fill(1.0)
    else:
        np.random.default_rng([seed, tensor_index, chunk_index]).standard_normal(out=x, dtype=np.float32)
        x *= np.float32(STD)
    if dtype == "fp32":
        return x
    u = x.view(np.uint32)  # bf16 = top 16 bits after round-to-nearest-even (no NaNs here)
    r = u >> np.uint32(16)
    r &= np.uint32(1)
    r += np.uint32(0x7FFF)
    r += u
    r >>= np.uint32(16)
    return r.astype(np.uint16)


def model_files(c, dtype, shard_mib):
    """[(file name, [(name, shape, is_norm, tensor_index)])] the model is written as."""
    indexed = [(name, shape, norm, i) for i, (name, shape, norm) in enumerate(param_shapes(c))]
    shards = plan_shards(indexed, DTYPES[dtype][2], shard_mib << 20)
    if len(shards) == 1:
        return [("model.safetensors", shards[0])]
    n = len(shards)
    return [(f"model-{k + 1:05d}-of-{n:05d}.safetensors", s) for k, s in enumerate(shards)]


def write_safetensors(path, tensors, dtype, seed, pool, ahead):
    st_dtype, _, elem = DTYPES[dtype]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _, _ in tensors:
        size = numel(shape) * elem
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name, shape, norm, t in tensors:
            total = numel(shape)
            starts = range(0, total, CHUNK_VALUES)
            window = []  # futures in order, at most `ahead` outstanding (bounded memory)
            for k, start in enumerate(starts):
                window.append(pool.submit(chunk_values, seed, t, k, min(CHUNK_VALUES, total - start), norm, dtype))
                if len(window) >= ahead:
                    f.write(window.pop(0).result())
            for fut in window:
                f.write(fut.result())
    return offset


def model_complete(out_dir, c, dtype, shard_mib=2000):
    """True when out_dir holds this config and every weight file at its expected size."""
    try:
        with open(os.path.join(out_dir, "config.json")) as f:
            if json.load(f) != json.loads(json.dumps(c)):
                return False
    except (OSError, ValueError):
        return False
    for fname, tensors in model_files(c, dtype, shard_mib):
        path = os.path.join(out_dir, fname)
        data = sum(numel(s) for _, s, _, _ in tensors) * DTYPES[dtype][2]
        try:
            with open(path, "rb") as f:
                (hlen,) = struct.unpack("<Q", f.read(8))
            if os.path.getsize(path) != 8 + hlen + data:
                return False
        except (OSError, struct.error):
            return False
    return True


def write_model(out_dir, c, dtype, seed=1234, shard_mib=2000, threads=2):
    os.makedirs(out_dir, exist_ok=True)
    cfg_path = os.path.join(out_dir, "config.json")
    if os.path.exists(cfg_path):
        os.remove(cfg_path)  # the directory is incomplete until config.json is back
    for stale in os.listdir(out_dir):
        if stale.endswith(".safetensors") or stale == "model.safetensors.index.json":
            os.remove(os.path.join(out_dir, stale))
    files = model_files(c, dtype, shard_mib)
    weight_map, total = {}, 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for fname, tensors in files:
            total += write_safetensors(os.path.join(out_dir, fname), tensors, dtype, seed, pool, 2 * max(1, threads))
            weight_map.update({name: fname for name, _, _, _ in tensors})
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    with open(cfg_path, "w") as f:
        f.write(json.dumps(c, indent=2, sort_keys=True) + "\n")
    return total, [fname for fname, _ in files]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="model directory to write (its weight files are replaced)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--inter", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--ctx", type=int)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--shard-mib", type=int, default=2000, help="largest shard in MiB (default 2000)")
    p.add_argument("--threads", type=int, default=2, help="threads generating chunks (default 2)")
    a = p.parse_args()
    if sys.byteorder != "little":
        sys.exit("make_random_llama: it writes the host's arrays as safetensors' little-endian data; "
                 "run it on a little-endian machine")
    c = make_config(a.preset, a.dtype, a.layers, a.hidden, a.inter, a.heads, a.kv_heads, a.vocab, a.ctx)
    t0 = time.time()
    total, files = write_model(a.out, c, a.dtype, a.seed, a.shard_mib, a.threads)
    dt = time.time() - t0
    print(f"make_random_llama: {a.out}: {param_count(c) / 1e6:.1f}M params, {a.dtype}, {total / 2**20:.1f} MiB "
          f"in {len(files)} file(s), {dt:.1f} s ({total / dt / 1e9:.2f} GB/s)")


if __name__ == "__main__":
    main()
