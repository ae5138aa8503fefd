// Where every GPT-2 tensor lives: one flat fp32 segment per transformer block ("layer.i"), one for
// the embeddings ("embed": wte, wpe; wte doubles as the tied LM head) and one for the final
// LayerNorm ("head"). Grads and AdamW moments use the same layout in their own segments.
// Note [segment layout]: tensors start on 64-byte boundaries inside a segment and every segment's
// size is a multiple of 4 KiB, so a segment can be moved with O_DIRECT I/O as one range.
// Does not own memory (see store/segment_store.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/model_config.h"

namespace stratum {

// Activations: the block input of a layer segment (the final blocks' output for "head"), kept
// from forward to backward; "embed" has none. Sized by the batch, not by the layout.
enum class SegmentKind { Params = 0, Grads = 1, AdamM = 2, AdamV = 3, Activations = 4 };
inline constexpr int kSegmentKindCount = 5;
const char* segment_kind_name(SegmentKind kind);

struct TensorSlot {
  std::string name;                 // Hugging Face name without "transformer.", e.g. "h.3.attn.c_attn.weight"
  std::size_t offset_floats = 0;    // from the start of the segment
  std::vector<std::int64_t> shape;  // as stored by Hugging Face (Conv1D weights are (in, out))
  std::size_t numel = 0;
  bool weight_decay = false;        // AdamW decays tensors with >= 2 dims (weights and embeddings)
};

struct SegmentLayout {
  std::string name;                 // "embed", "layer.3", "head"
  std::vector<TensorSlot> tensors;  // in a fixed order (see BlockTensor for blocks)
  std::size_t size_floats = 0;      // padded to a multiple of 1024 floats (4 KiB)
  std::size_t size_bytes() const { return size_floats * sizeof(float); }
};

// Order of tensors inside a block segment.
enum BlockTensor : int {
  kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB,
  kBlockTensorCount
};
enum EmbedTensor : int { kWte, kWpe };
enum HeadTensor : int { kLnFW, kLnFB };

class ParamLayout {
 public:
  static ParamLayout gpt2(const GptConfig& config);

  const std::vector<SegmentLayout>& segments() const { return segments_; }
  int segment_count() const { return static_cast<int>(segments_.size()); }
  int embed_segment() const { return 0; }
  int layer_segment(int layer) const { return 1 + layer; }
  int head_segment() const { return static_cast<int>(segments_.size()) - 1; }
  std::size_t num_params() const;  // real parameters, without padding
  // Finds a tensor by Hugging Face name (with or without "transformer."); false if unknown.
  bool find(std::string_view hf_name, int* segment, int* tensor) const;

 private:
  std::vector<SegmentLayout> segments_;
};

}  // namespace stratum
