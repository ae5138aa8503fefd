"""Loads what Stratum saved with Hugging Face transformers (and PEFT for LoRA adapters) and checks
that it decodes the tokens Stratum decoded (tools/hf_load_check.sh writes the expectations).

Input: a file of lines "NAME MODEL_DIR ADAPTER_DIR|- VAL.bin LOSS ID,ID,..." and the prompt ids.
VAL.bin holds B*T+1 uint16 tokens (B = 4, T = 32): Stratum's validation batch (inputs [0, B*T)
as B rows of T, targets shifted by one); LOSS is the mean cross-entropy Stratum reported for it;
the ids are Stratum's greedy continuation of the prompt. For each line:
AutoModelForCausalLM.from_pretrained(MODEL_DIR) in float32, PeftModel.from_pretrained(model,
ADAPTER_DIR) when there is one (any warning about missing or unexpected keys fails the check);
the loss of the batch must match to 1e-4 and greedy decoding (argmax of the last position's
logits, no stopping) must give the same tokens. Prints per model both losses, the tokens and the
smallest top-1/top-2 logit margin seen (a mismatch at a near-tie says so).
Exit status 1 when any model fails to load or decodes differently.
"""

import array
import sys
import warnings

import torch
import transformers
from transformers import AutoModelForCausalLM


def greedy(model, prompt, n):
    ids = torch.tensor([prompt], dtype=torch.long)
    margins = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=ids).logits[0, -1].double()
            top = torch.topk(logits, 2)
            margins.append(float(top.values[0] - top.values[1]))
            ids = torch.cat([ids, top.indices[:1].view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist(), min(margins)


def batch_loss(model, val_path, B=4, T=32):
    v = array.array("H")
    v.frombytes(open(val_path, "rb").read())
    assert len(v) == B * T + 1, f"{val_path}: {len(v)} tokens, want {B * T + 1}"
    toks = torch.tensor(list(v), dtype=torch.long)
    inputs, targets = toks[:-1].view(B, T), toks[1:].view(B, T)
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.double()
    return float(torch.nn.functional.cross_entropy(logits.view(B * T, -1), targets.reshape(-1)))


def main():
    expected_path, prompt_text = sys.argv[1], sys.argv[2]
    prompt = [int(t) for t in prompt_text.split(",")]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", end="")
    try:
        import peft
        from peft import PeftModel
        print(f", peft {peft.__version__}")
    except ImportError:
        PeftModel = None
        print(", no peft")
    failures = 0
    for line in open(expected_path):
        name, model_dir, adapter_dir, val_path, loss_text, ids_text = line.split()
        stratum_loss = float(loss_text)
        want = [int(t) for t in ids_text.split(",")]
        if want[: len(prompt)] == prompt:
            want = want[len(prompt):]
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
                if adapter_dir != "-":
                    if PeftModel is None:
                        raise RuntimeError("peft is not installed")
                    model = PeftModel.from_pretrained(model, adapter_dir)
            bad = [str(w.message) for w in caught if "key" in str(w.message).lower()]
            if bad:
                raise RuntimeError("load warned: " + " | ".join(bad))
            model.eval()
            hf_loss = batch_loss(model, val_path)
            got, margin = greedy(model, prompt, len(want))
        except Exception as e:  # report every model, then fail
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            failures += 1
            continue
        status = "ok" if got == want and abs(hf_loss - stratum_loss) <= 1e-4 else "FAIL"
        failures += status != "ok"
        print(f"{status} {name} ({type(model).__name__}): loss transformers {hf_loss:.6f} stratum {stratum_loss:.6f}; "
              f"greedy transformers {got} stratum {want} (smallest top-2 logit margin {margin:.3g})")
    print("hf_load_check:", "every directory loaded, gave Stratum's loss and decoded Stratum's tokens" if failures == 0 else f"{failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
