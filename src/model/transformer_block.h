// The transformer block of a config's family (GPT-2 or Llama) behind one interface, with the
// block internals it keeps (one set when recomputing, one per layer when keeping activations),
// its shared workspace and, for Llama, the rotary table. The executor calls it per layer and does
// not care which family it runs. Does not know where segments live.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/aligned_buffer.h"
#include "ops/ops_buffer.h"
#include "ops/ops.h"
#include "model/gpt2_block.h"
#include "model/llama_block.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace stratum {

// A block's adapters as held: its "lora.i" segment's layout and chunks (Note [lora segments]).
struct LoraChunks {
  const SegmentLayout* seg = nullptr;
  float* const* params = nullptr;
  float* const* grads = nullptr;  // backward: the adapters' gradients (overwritten)
  // A training pass of a layout with lora_dropout > 0 (Executor::lora_chunks decides): the
  // step's dropout_step_key (Note [lora dropout]).
  bool dropout = false;
  std::uint64_t dropout_step_key = 0;
};

// A block's adapters as LoraBlock pointers into held chunks (Note [lora segments]), with each
// module's dropout key when c.dropout; no u, du or xd. A module in a chunk not given (null) has
// none.
LoraBlock lora_block_of(const ParamLayout& layout, const LoraChunks& chunks);
// Slot of module k's base weight in a block segment (Note [lora math] numbers the modules).
int lora_base_slot(ModelArch arch, int k);

class TransformerBlock {
 public:
  // copies: sets of block internals (1 = recompute in the backward; n_layer = keep them; 0 = the
  // store holds them, Note [activations offload] in exec/executor.h). layout
  // (may be null): where its LoRA adapters are, when it has them (each set of internals then
  // keeps the adapters' x A^T too). bf16_weights: params may come as bf16 views (Note [frozen
  // bf16 base] in model/block_policy.h; the workspace gets room to widen them). recompute: the
  // sets are refilled by the backward's recompute, so their row-wise buffers hold one chunk (Note
  // [row chunks] in model/block_policy.h); kept sets hold every row. backward false: forward passes
  // only (zeroth-order training): the workspace has none of the backward's gradient buffers.
  // rows: the row chunk (Note [row chunks] in model/block_policy.h) and the MLP half's sub-chunk,
  // smaller only where it has nothing to train (no backward, or ParamLayout::mlp_frozen; Note
  // [frozen MLP rows]).
  TransformerBlock(const Ops& ops, const GptConfig& config, int max_batch, int max_seq, int copies,
                   const ParamLayout* layout = nullptr, bool bf16_weights = false, bool recompute = false,
                   bool backward = true, BlockRows rows = {});
  std::size_t size_bytes() const;  // internals + workspace + rotary table
  const BlockRows& rows() const { return cfg_.llama() ? llama_work_->rows : gpt2_work_->rows; }
  // Floats of one set of internals held outside (an Internals unit): the family's training
  // activations without the borrowed rows, then the adapters' x A^T (with LoRA).
  static std::size_t held_floats(const GptConfig& config, int max_batch, int max_seq, const ParamLayout* layout);

  // Where a pass's internals are: own set `copy`, or, with held non-null, held_floats() floats
  // of memory the caller holds (64-byte aligned).
  struct InternalsAt {
    int copy = 0;
    float* held = nullptr;
  };
  // out (B,T,C) = block(x) with the parameters in params (one typed view per chunk of `seg`:
  // fp32, or bf16 with bf16_weights), keeping the internals at `at`. part: one half (Note [block
  // halves] in model/param_layout.h), whose chunks alone need be given (the others empty views,
  // the adapters' chunks null).
  void forward(const Ops& ops, const SegmentLayout& seg, const TensorView* params, const float* x, float* out,
               InternalsAt at, int B, int T, const LoraChunks* lora = nullptr, BlockPart part = BlockPart::Whole);
  // dx (B,T,C) and the block's gradients (overwritten, in the fp32 chunks `grads`; null: a frozen
  // base) for dout; with recompute the internals are first recomputed from x into `at`. dx may be
  // dout (in place: each chunk reads its dout rows before it writes its dx rows).
  // part: Note [attention recompute first] in model/param_layout.h (Attention: only the held
  // attention half's chunks need be given).
  void backward(const Ops& ops, const SegmentLayout& seg, const TensorView* params, const TensorView* grads,
                const float* x, const float* dout, float* dx, InternalsAt at, int B, int T, bool recompute,
                const LoraChunks* lora = nullptr, BlockPart part = BlockPart::Whole);

 private:
  LoraBlock lora_block(const LoraChunks& chunks, InternalsAt at, int BT);
  // One set's adapters' x A^T buffers (0 without adapters).
  static std::size_t lora_u_floats(int max_batch, int max_seq, const ParamLayout* layout);
  // The internals at `at`: an own set, or `view` made over the held memory.
  LlamaActivations& internals(InternalsAt at, std::optional<LlamaActivations>& view);
  Gpt2Activations& internals(InternalsAt at, std::optional<Gpt2Activations>& view);
  std::size_t internals_bytes() const;  // without the adapters' buffers

  GptConfig cfg_;
  int max_batch_, max_seq_;
  std::vector<Gpt2Activations> gpt2_acts_;
  std::unique_ptr<Gpt2Workspace> gpt2_work_;
  std::vector<LlamaActivations> llama_acts_;
  std::unique_ptr<LlamaWorkspace> llama_work_;
  std::unique_ptr<LlamaRopes> ropes_;
  const ParamLayout* layout_ = nullptr;  // with adapters, else null
  std::vector<OpsBuffer> lora_u_;    // per set: (targets, B*T, r) x A^T of each adapter
  OpsBuffer lora_du_;                // (B*T, r) backward scratch
  OpsBuffer lora_xd_;                // (B*T, widest adapted in): the dropped input (lora_dropout > 0)
  std::size_t lora_rows_ = 0;            // max B*T
};

}  // namespace stratum
