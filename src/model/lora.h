// LoRA adapters with Hugging Face PEFT's semantics: which linear layers of a family can carry one,
// how a run names them (PEFT's target_modules matching), and the adapter's forward and backward
// beside the frozen base product. Does not own weights (they are the "lora.i" segments of a
// ParamLayout, Note [lora segments] in model/param_layout.h) and does not read or write files.
// Note [lora math]: for an adapted linear y = base(x) (x (M, in), y (M, out)), with A (r, in) and
// B (out, r) as PEFT stores lora_A.weight and lora_B.weight (for GPT-2's Conv1D too: PEFT's
// fan_in_fan_out only transposes the base weight), and s = alpha / r (alpha / sqrt(r) with rsLoRA):
//   forward:  u = x A^T (M, r), kept for the backward;  y += s * u B^T
//   backward: dB = s * dy^T u;  du = s * dy B;  dA = du^T x;  dx += du A
// (PEFT computes lora_B(lora_A(dropout(x))) * s: with dropout, x above is the dropped input xd,
// and the input gradient is dropout(du A) with the same mask, Note [lora dropout]). Every product
// is an Ops::sgemm with a fixed shape, so the bits depend on the shapes only, never on where the
// adapter lives.
// Note [lora dropout]: lora_dropout p > 0 drops each adapter's input in training passes only
// (never in validation, generation, merging or zeroth-order passes: MeZO evaluates the model in
// eval mode). Each adapted module draws its own mask, as PEFT gives each LoraLayer its own
// nn.Dropout: the mask of Note [dropout mask] (core/dropout_mask.h) over the module's (B*T, in)
// input, with key mix(dropout_step_key(seed, step) ^ fnv1a64(M)) for the run's seed, the 0-based
// optimizer step and M the module's Hugging Face name ("transformer.h.0.attn.c_attn",
// "model.layers.3.mlp.down_proj"): zo_tensor_key's derivation (core/zo_noise.h). The mask is
// regenerated in the backward (and the recompute), never stored; a resumed run draws the same.
// With --grad-accum N the "step" of micro-batch k of optimizer step t is t*N + k (Note [gradient
// accumulation] in exec/executor.h), so every micro-batch draws its own masks, on any rank.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "ops/ops.h"

namespace stratum {

// At most this many adaptable linears in a block (Llama's seven).
inline constexpr int kLoraMaxTargets = 7;

struct LoraConfig {
  int r = 0;           // rank; 0 = no adapters
  double alpha = 16;   // lora_alpha
  bool rslora = false; // scale alpha / sqrt(r) instead of alpha / r
  double dropout = 0;  // lora_dropout (Note [lora dropout])
  std::vector<std::string> targets;  // target_modules as the user gave them ("q_proj", "c_attn")
  bool on() const { return r > 0; }
  float scale() const;
};

// Note [fused lora]: which modules carry adapters is a family's: GPT-2's four Conv1D, Llama's
// seven projections, and Phi-3's four PEFT modules (Note [phi3 fused] in model/model_config.h),
// two of them fused: qkv_proj's one lora_A (r, C) and one lora_B (Q + 2 KV, r) adapt q, k and v
// together, gate_up_proj's lora_B (2 I, r) gate and up. The block code sees projection k of
// Llama's seven either way: a fused module's part k is an adapter whose B (and dB) are the part's
// rows of the module's lora_B, sharing the module's A, its dropout mask and (recomputed, the same
// bits) its x A^T; its parts' backward writes dB's rows each and adds their dA in part order (the
// first writes it: LoraBlock::Target::da_adds), so dA = sum over parts of du_k^T x, what PEFT's
// one product over the fused output computes up to its summation order.
enum class LoraFamily { Gpt2, Llama, Phi3 };
LoraFamily lora_family(const GptConfig& cfg);
// A block's adaptable linears, in block order, as module paths under the block, one per projection
// k: GPT-2 "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"; Llama "self_attn.q_proj" ..
// "mlp.down_proj"; Phi-3 Llama's seven with q, k, v named "self_attn.qkv_proj" and gate, up
// "mlp.gate_up_proj" (Note [fused lora]: a fused module is every k that carries its name).
const std::vector<std::string>& lora_modules(LoraFamily family);
// Whether module k of lora_modules(family) is in a block's MLP half ("mlp.c_fc", "mlp.down_proj",
// ...), not its attention half (Note [block halves] in model/param_layout.h).
bool lora_module_in_mlp(LoraFamily family, int k);
// (in, out) of projection k (a fused module's part: its own rows).
std::array<int, 2> lora_module_dims(const GptConfig& cfg, int k);
// Which modules the targets name, PEFT's way (a key matches a module whose path is the key or ends
// with "." + key); throws a one-line Error naming the key and the valid ones when a key matches
// nothing, or when no key is given.
std::array<bool, kLoraMaxTargets> lora_targets_resolve(LoraFamily family, const std::vector<std::string>& targets);
// Whether one target key names a linear layer of the family's block (the same matching).
bool lora_target_known(LoraFamily family, const std::string& key);
// A run's LoRA settings from its options: targets_csv is a comma-separated target_modules list,
// empty for PEFT's default of the family (GPT-2 c_attn, Llama q_proj and v_proj, Phi-3 qkv_proj,
// o_proj, gate_up_proj and down_proj). r 0: off; otherwise validated (lora_config_validate).
LoraConfig lora_config_make(LoraFamily family, int r, double alpha, const std::string& targets_csv, bool rslora,
                            double dropout);
// target_modules as a comma-separated list (the option's and the trainer state's form).
std::string lora_targets_text(const LoraConfig& lora);
// Throws a one-line Error for r <= 0, alpha <= 0 or bad targets; returns the modules the targets
// name (lora_targets_resolve).
std::array<bool, kLoraMaxTargets> lora_config_validate(const LoraConfig& lora, LoraFamily family);

// One block's adapters as the block forward and backward see them (null a = module not adapted).
struct LoraBlock {
  struct Target {
    const float* a = nullptr;  // (r, in)
    const float* b = nullptr;  // (out, r)
    float* da = nullptr;       // (r, in) gradient (backward), overwritten
    float* db = nullptr;       // (out, r)
    float* u = nullptr;        // (M, r) x A^T, kept from the forward
    std::uint64_t drop_key = 0;  // the module's dropout key this step (Note [lora dropout])
    bool da_adds = false;  // a fused module's later part: its dA adds to the earlier parts' (Note [fused lora])
  };
  int r = 0;
  float scale = 1.0f;
  std::array<Target, kLoraMaxTargets> t{};
  float* du = nullptr;    // (M, r) backward scratch
  float dropout = 0.0f;   // > 0: drop the adapters' input (a training pass, Note [lora dropout])
  float* xd = nullptr;    // (M, widest in) scratch for the dropped input, with dropout
};

// y (M, out), row stride ldy, += s * (x A^T) B^T for x (M, in), row stride ldx; keeps u.
void lora_forward(const Ops& ops, const LoraBlock& lora, int k, float* y, int ldy, const float* x, int ldx, int M,
                  int in, int out);
// lora_forward's u alone (the backward's recompute of a module whose output is not needed).
void lora_forward_u(const Ops& ops, const LoraBlock& lora, int k, const float* x, int ldx, int M, int in);
// For dy (M, out) (stride ldy) of module k's output: writes dA, dB (accumulate: adds to them)
// and adds the input gradient to dx (M, in) (stride lddx).
void lora_backward(const Ops& ops, const LoraBlock& lora, int k, const float* dy, int ldy, const float* x, int ldx,
                   float* dx, int lddx, int M, int in, int out, bool accumulate = false);
// Module k of `lora` for rows r0.. of its pass (Note [row chunks] in model/block_policy.h):
// its kept u and its dropout mask (input width `in`) start at row r0.
LoraBlock lora_rows(const LoraBlock& lora, int k, int r0, int in);

// Folds module k's adapter into its base weight w, as PEFT's merge: w += s * (B A), transposed
// for GPT-2's Conv1D w (in, out) (fan_in_fan_out); nn.Linear's w is (out, in).
void lora_merge(const Ops& ops, const LoraBlock& lora, int k, float* w, bool fan_in_fan_out, int in, int out);

}  // namespace stratum
