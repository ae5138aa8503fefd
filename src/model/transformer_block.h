// The transformer block of a config's family (GPT-2 or Llama) behind one interface, with the
// block internals it keeps (one set when recomputing, one per layer when keeping activations),
// its shared workspace and, for Llama, the rotary table. The executor calls it per layer and does
// not care which family it runs. Does not know where segments live.
#pragma once

#include <memory>
#include <vector>

#include "ops/ops.h"
#include "model/gpt2_block.h"
#include "model/llama_block.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace stratum {

class TransformerBlock {
 public:
  // copies: sets of block internals (1 = recompute in the backward; n_layer = keep them).
  TransformerBlock(const Ops& ops, const GptConfig& config, int max_batch, int max_seq, int copies);
  std::size_t size_bytes() const;  // internals + workspace + rotary table

  // out (B,T,C) = block(x) with the parameters in param_chunks (one pointer per chunk of `seg`),
  // keeping the internals in set `copy`.
  void forward(const Ops& ops, const SegmentLayout& seg, float* const* param_chunks, const float* x, float* out,
               int copy, int B, int T);
  // dx (B,T,C) and the block's gradients (overwritten, in grad_chunks) for dout; with recompute
  // the internals are first recomputed from x into set `copy`.
  void backward(const Ops& ops, const SegmentLayout& seg, float* const* param_chunks, float* const* grad_chunks,
                const float* x, const float* dout, float* dx, int copy, int B, int T, bool recompute);

 private:
  GptConfig cfg_;
  std::vector<Gpt2Activations> gpt2_acts_;
  std::unique_ptr<Gpt2Workspace> gpt2_work_;
  std::vector<LlamaActivations> llama_acts_;
  std::unique_ptr<LlamaWorkspace> llama_work_;
  std::unique_ptr<RopeTable> rope_;
};

}  // namespace stratum
