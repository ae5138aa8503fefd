"""LoRA over a frozen base with Hugging Face PEFT's semantics, in plain PyTorch (no PEFT needed):
the reference `stratum train --lora-*` is checked against.

What it does:
  - adapters_make(...): lora_A (r, in) and lora_B (out, r) for every block module a PEFT
    target_modules list matches (a key matches a module whose path is the key or ends with
    "." + key), both drawn at random (B nonzero, so the first step already moves A too).
  - adapter_fn(adapters, scale, drop): the hook the forwards of torch_gpt2 / torch_llama take:
    y + lora_B(lora_A(dropout(x))) * scale, as PEFT's LoraLayer; scale = alpha / r, or
    alpha / sqrt(r) with rsLoRA; dropout (drop = (p, step key), else none) with Stratum's mask
    (dropout_mask: Note [dropout mask] in src/core/dropout_mask.h and Note [lora dropout] in
    src/model/lora.h, reproduced exactly, so the reference and Stratum drop the same elements).
  - adapter_dir_write(...): a PEFT adapter directory (adapter_config.json +
    adapter_model.safetensors, names "base_model.model.<module>.lora_A.weight").
  - write_reference(...): from a golden model and its tokens.bin: writes DIR/lora_init (the
    initial adapters, which the test passes to --lora-init) and DIR/reference_lora.safetensors:
    the loss and adapter gradients of batch 0 ("grad.<PEFT name>"), and an AdamW run of the
    adapters alone (train_losses, train_grad_norms, train_lrs, "final.<PEFT name>"), with the
    base frozen, tg.make_optimizer's decay groups and global-norm clipping over the adapters.
    With dropout (p and the run's seed): the same run with lora_dropout p into
    DIR/reference_lora_dropout.safetensors (lora_init/ and lora_args.json are not rewritten).
What it does not do: the model's forward (the caller's), merging.
"""

import json
import math
import os

import numpy as np
import torch

import torch_gpt2 as tg

PREFIX = "base_model.model."
GPT2_MODULES = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
LLAMA_MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def _matches(module, key):
    return module == key or module.endswith("." + key)


def adapters_make(base, layer_prefix, n_layer, modules, targets, r, gen, fan_in_fan_out):
    """{module HF name: (A, B)}; the base weight gives (in, out) (Conv1D (in, out) when
    fan_in_fan_out, else nn.Linear (out, in))."""
    adapters = {}
    for i in range(n_layer):
        for m in modules:
            if not any(_matches(m, k) for k in targets):
                continue
            name = f"{layer_prefix}{i}.{m}"
            w = base[name + ".weight"]
            fan_in, fan_out = (w.shape[0], w.shape[1]) if fan_in_fan_out else (w.shape[1], w.shape[0])
            a = (torch.rand(r, fan_in, generator=gen, dtype=torch.float32) * 2 - 1) / math.sqrt(fan_in)
            b = torch.randn(fan_out, r, generator=gen, dtype=torch.float32) * 0.05
            adapters[name] = (a, b)
    return adapters


def dropout_step_key(seed, step):
    """Note [dropout mask]: the run's dropout key of a 0-based step."""
    import torch_zo
    return torch_zo._mix_int((seed ^ 0x44726F704F757421) + (step + 1) * torch_zo._GOLDEN)


def dropout_mask(skey, module, shape, p):
    """float32 array of `shape`: 1 / (1 - p) where module's input element is kept, else 0
    (element index row-major over the flattened input; key of the module's HF name)."""
    import torch_zo
    n = int(np.prod(shape))
    i = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = torch_zo._mix_array(np.uint64(torch_zo.tensor_key(skey, module)) + i * np.uint64(torch_zo._GOLDEN))
    threshold = math.floor(float(np.float32(p)) * 16777216.0 + 0.5)  # llround
    keep = (h >> np.uint64(40)) >= np.uint64(threshold)
    return np.where(keep, np.float32(1.0 / (1.0 - float(np.float32(p)))), np.float32(0)).reshape(shape)


def adapter_fn(adapters, scale, drop=None):
    """drop: None, or (p, step key): dropout on each adapter's input, its own mask per module."""
    def f(module, x, y):
        if module not in adapters:
            return y
        a, b = adapters[module]
        if drop is not None:
            x = x * torch.from_numpy(dropout_mask(drop[1], module, tuple(x.shape), drop[0]))
        return y + torch.nn.functional.linear(torch.nn.functional.linear(x, a), b) * scale
    return f


def _flat(adapters):
    out = {}
    for name, (a, b) in adapters.items():
        out[PREFIX + name + ".lora_A.weight"] = a
        out[PREFIX + name + ".lora_B.weight"] = b
    return out


def adapter_dir_write(path, adapters, config):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    tg.save_safetensors(os.path.join(path, "adapter_model.safetensors"),
                        {n: t.detach().to(torch.float32).contiguous() for n, t in _flat(adapters).items()},
                        metadata={"format": "pt"})


def write_zo_reference(out_dir, base, forward_loss, lora, zo_args, generator):
    """Zeroth-order SGD of the adapters in out_dir/lora_init (written by write_reference) over the
    frozen base (tools/torch_zo.py; z named by Stratum's slot names, the PEFT names less
    "base_model.model."): out_dir/reference_lora_zo.safetensors."""
    import torch_zo
    tensors, _ = tg.load_safetensors(os.path.join(out_dir, "lora_init", "adapter_model.safetensors"))
    init = {n[len(PREFIX):]: t.to(torch.float32) for n, t in tensors.items()}
    scale = lora["alpha"] / (math.sqrt(lora["r"]) if lora["rslora"] else lora["r"])
    frozen = {n: t.detach() for n, t in base.items()}

    def loss(params, x, y):
        adapters = {n[:-len(".lora_A.weight")]: (params[n], params[n[:-len("lora_A.weight")] + "lora_B.weight"])
                    for n in params if n.endswith(".lora_A.weight")}
        return forward_loss(frozen, x, y, adapter_fn(adapters, scale))

    return torch_zo.write_reference(out_dir, init, loss, zo_args, generator, file="reference_lora_zo.safetensors")


def write_reference(out_dir, base, forward_loss, args, lora, generator, dropout=None):
    """forward_loss(base, x, y, adapter) -> loss. args: batch, seq, steps, lr, lr_schedule, warmup,
    min_lr, beta1, beta2, eps, weight_decay, grad_clip; lora: r, alpha, rslora, targets, modules,
    layer_prefix, n_layer, fan_in_fan_out, seed; dropout: None or {p, seed} (the run's --seed).
    Returns a summary."""
    tokens = torch.from_numpy(np.fromfile(os.path.join(out_dir, "tokens.bin"), dtype="<u2").astype(np.int64))
    a = args
    gen = torch.Generator().manual_seed(lora["seed"])
    init = adapters_make(base, lora["layer_prefix"], lora["n_layer"], lora["modules"], lora["targets"], lora["r"],
                         gen, lora["fan_in_fan_out"])
    scale = lora["alpha"] / (math.sqrt(lora["r"]) if lora["rslora"] else lora["r"])
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "", "r": lora["r"],
              "lora_alpha": lora["alpha"], "lora_dropout": 0.0, "target_modules": lora["targets"],
              "fan_in_fan_out": lora["fan_in_fan_out"], "bias": "none", "use_rslora": lora["rslora"],
              "modules_to_save": None, "init_lora_weights": True, "inference_mode": True}
    if dropout is None:
        adapter_dir_write(os.path.join(out_dir, "lora_init"), init, config)

    frozen = {n: t.detach() for n, t in base.items()}
    adapters = {n: (t_a.clone().requires_grad_(True), t_b.clone().requires_grad_(True)) for n, (t_a, t_b) in init.items()}
    params = _flat(adapters)  # PEFT name -> leaf
    opt = tg.make_optimizer(params, a["lr"], a["beta1"], a["beta2"], a["eps"], a["weight_decay"])
    out = {}
    losses, norms, lrs = [], [], []
    for s in range(a["steps"]):
        for t in params.values():
            t.grad = None
        x, y = tg.get_batch(tokens, s, a["batch"], a["seq"])
        drop = None if dropout is None else (dropout["p"], dropout_step_key(dropout["seed"], s))
        loss = forward_loss(frozen, x, y, adapter_fn(adapters, scale, drop))
        loss.backward()
        if s == 0:
            for n, t in params.items():
                out["grad." + n] = t.grad.detach().clone()
        norm = tg.grad_norm_and_clip(params, a["grad_clip"])
        lr = tg.lr_at(s, a["lr"], a["warmup"], a["min_lr"], a["steps"], a["lr_schedule"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(float(loss.detach()))
        norms.append(norm)
        lrs.append(lr)
    out.update({"train_losses": torch.tensor(losses, dtype=torch.float32),
                "train_grad_norms": torch.tensor(norms, dtype=torch.float32),
                "train_lrs": torch.tensor(lrs, dtype=torch.float32)})
    for n, t in params.items():
        out["final." + n] = t.detach().to(torch.float32).contiguous()
    meta = {"generator": generator, "torch_version": torch.__version__, "train_args": json.dumps(a),
            "lora": json.dumps(lora)}
    if dropout is not None:
        meta["dropout"] = json.dumps(dropout)
    name = "reference_lora.safetensors" if dropout is None else "reference_lora_dropout.safetensors"
    tg.save_safetensors(os.path.join(out_dir, name), out, metadata=meta)
    if dropout is None:
        with open(os.path.join(out_dir, "lora_args.json"), "w") as f:
            json.dump(a, f, indent=2)
            f.write("\n")
    moved = max(float((out["final." + n] - t.detach()).abs().max()) for n, t in _flat(init).items())
    return {"losses": losses, "norms": norms, "largest_move": moved, "tensors": len(params)}
