"""Zeroth-order SGD (MeZO) with Stratum's z generator, as the reference `stratum train
--optimizer zo-sgd` is checked against.

What it does:
  - zo_z(step_key, name, shape): the perturbation direction of Note [zo noise]
    (src/core/zo_noise.h), reproduced exactly: SplitMix64's finaliser over (key, element index),
    the top 16 bits indexing a table of 65536 normal quantiles found by bisection on math.erfc.
  - zo_run(params, loss_fn, ...): MeZO steps in float32 numpy arithmetic, in the order
    Stratum applies them (per element: p + z*eps; then -2*eps; then the restore p + z*eps and
    p - lr*(g*z + wd*p), with g = (L+ - L-) / (2 eps) in double rounded to float32); weight decay
    on tensors with 2 or more dims. Returns the losses, projected gradients and final parameters.
  - write_reference(...): one such run of a golden model on its tokens.bin, written as
    reference_zo.safetensors (what tools/README.md describes).
What it does not do: the model's forward (the caller's), any other optimizer.
"""

import math

import json
import os

import numpy as np
import torch

import torch_gpt2 as tg

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix_int(x):
    x &= _MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _mix_array(x):
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_TABLE = None


def normal_table():
    global _TABLE
    if _TABLE is None:
        q = np.zeros(1 << 16, dtype=np.float32)
        root2 = math.sqrt(2.0)
        for j in range(1 << 15):
            p = (j + 0.5) / 65536
            lo, hi = -9.0, 9.0
            for _ in range(64):
                mid = 0.5 * (lo + hi)
                if 0.5 * math.erfc(-mid / root2) < p:
                    lo = mid
                else:
                    hi = mid
            q[j] = np.float32(0.5 * (lo + hi))
            q[65535 - j] = -q[j]
        _TABLE = q
    return _TABLE


def step_key(seed, step):
    return _mix_int(seed + (step + 1) * _GOLDEN)


def tensor_key(skey, name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h ^= c
        h = (h * 0x100000001B3) & _MASK
    return _mix_int(skey ^ h)


def zo_z(skey, name, shape):
    """z for every element of the tensor `name` (float32 numpy array of `shape`)."""
    n = int(np.prod(shape)) if len(shape) else 1
    i = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = _mix_array(np.uint64(tensor_key(skey, name)) + i * np.uint64(_GOLDEN))
    return normal_table()[(h >> np.uint64(48)).astype(np.int64)].reshape(shape)


def zo_run(params, loss_fn, steps, seed, eps, lr_at, weight_decay):
    """params: {HF name: float32 tensor}; loss_fn(params, k): the loss on batch k.

    Returns dict: loss_plus, loss_minus, grads (per step, float64) and {name: final float32 array}.
    """
    p = {n: t.detach().to(torch.float32).numpy().copy() for n, t in params.items()}
    eps32 = np.float32(eps)
    pending = None
    plus, minus, grads = [], [], []

    def loss_of(k):
        with torch.no_grad():
            return float(loss_fn({n: torch.from_numpy(a) for n, a in p.items()}, k))

    def restore_update(pend):
        skey, g32, lr32 = pend
        for n, a in p.items():
            z = zo_z(skey, n, a.shape)
            wd = np.float32(weight_decay if a.ndim >= 2 else 0.0)
            a = a + z * eps32
            p[n] = a - lr32 * (g32 * z + wd * a)

    for s in range(steps):
        skey = step_key(seed, s)
        if pending is not None:
            restore_update(pending)
        for n, a in p.items():
            p[n] = a + zo_z(skey, n, a.shape) * eps32
        lp = loss_of(s)
        for n, a in p.items():
            p[n] = a + zo_z(skey, n, a.shape) * np.float32(-2.0 * eps32)
        lm = loss_of(s)
        g = (lp - lm) / (2.0 * eps)
        pending = (skey, np.float32(g), np.float32(lr_at(s)))
        plus.append(lp)
        minus.append(lm)
        grads.append(g)
    restore_update(pending)
    return {"loss_plus": plus, "loss_minus": minus, "grads": grads, "params": p}


def write_reference(out_dir, init, forward_loss, args, generator, file="reference_zo.safetensors"):
    """Runs zo_run on out_dir/tokens.bin (sequential batches, tg.get_batch) from `init` with
    `args` (batch, seq, steps, lr, lr_schedule, warmup, min_lr, zo_eps, weight_decay, seed);
    forward_loss(params, x, y) -> loss. Writes out_dir/reference_zo.safetensors and returns the
    projected gradients and the largest parameter move."""
    tokens = torch.from_numpy(np.fromfile(os.path.join(out_dir, "tokens.bin"), dtype="<u2").astype(np.int64))
    a = args

    def loss_fn(params, k):
        x, y = tg.get_batch(tokens, k, a["batch"], a["seq"])
        return forward_loss(params, x, y)

    run = zo_run(init, loss_fn, a["steps"], a["seed"], a["zo_eps"],
                 lambda s: tg.lr_at(s, a["lr"], a["warmup"], a["min_lr"], a["steps"], a["lr_schedule"]),
                 a["weight_decay"])
    out = {"zo_loss_plus": torch.tensor(run["loss_plus"], dtype=torch.float32),
           "zo_loss_minus": torch.tensor(run["loss_minus"], dtype=torch.float32),
           "zo_grads": torch.tensor(run["grads"], dtype=torch.float64)}
    for n, arr in run["params"].items():
        out["final." + n] = torch.from_numpy(arr)
    tg.save_safetensors(os.path.join(out_dir, file), out,
                        metadata={"generator": generator, "torch_version": torch.__version__,
                                  "zo_args": json.dumps(a)})
    moved = max(float(np.abs(run["params"][n] - init[n].to(torch.float32).numpy()).max()) for n in init)
    return {"grads": run["grads"], "largest_move": moved}
