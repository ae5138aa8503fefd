// Where every tensor lives: one flat fp32 segment per transformer block ("layer.i"), one for the
// position embedding ("embed": GPT-2's wpe; Llama has no position table, so its embed segment is
// one empty 4 KiB page and keeps the step schedule the same), one for the final norm ("head") and
// the token embedding cut into vocabulary blocks of rows ("wte.k" for GPT-2, "embed_tokens.k"
// for Llama). A tied LM head is the token embedding; an untied one (Llama) has vocabulary blocks
// of its own ("lm_head.k", role HeadVocab). Grads and AdamW moments use the same layout in their
// own segments.
// Note [vocab blocks]: wte is the largest tensor (V x C: 154 MB for GPT-2 small), so it is
// streamed a block of rows at a time: the embedding gathers from one block at a time and the LM
// head computes its logits, log-sum-exp and gradients per block (model/gpt2_head.h). The block
// size depends only on (V, C), never on the memory budget, so results are the same everywhere.
// Note [segment layout]: tensors start on 64-byte boundaries inside a segment and every segment's
// size is a multiple of 4 KiB, so a segment can be moved with O_DIRECT I/O as one range.
// Note [segment chunks]: a segment is cut into chunks of whole tensors, each starting on a 4 KiB
// boundary and about kChunkFloats long (a tensor larger than that is a chunk of its own, small
// tensors join their neighbours). Every kind (params, grads, moments) is stored and moved chunk by
// chunk, so the optimizer streams a block's state a chunk at a time (a few MB) and never holds a
// whole block; the block kernels get one pointer per tensor and do not care. Chunks depend only
// on the model's shape, and AdamW is elementwise, so they never change a result.
// Note [lora segments]: with LoRA adapters (model/lora.h) the layout appends one segment per block,
// "lora.i" (role Lora), after every other: for each adapted module in block order its lora_A
// (r, in) and lora_B (out, r), named as the module's weight with ".lora_A.weight" for ".weight"
// (PEFT's names less "base_model.model."). Then only the Lora segments are trainable: the base's
// segments have parameters only (no gradients, no moments: UnitTable), the backward computes no
// base gradient and the optimizer visits the adapters alone.
// Does not own memory (see store/segment_store.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor_view.h"
#include "model/lora.h"
#include "model/model_config.h"

namespace stratum {

// Activations: the block input of a layer segment (the final blocks' output for "head"), kept
// from forward to backward; "embed" and the vocabulary blocks have none. Sized by the batch.
// Internals: a layer's forward internals under --activations offload (Note [activations offload]
// in exec/executor.h), written by its forward and read by its backward; layers only.
// GradSum: with --grad-accum N > 1, the running sum of a trainable segment's gradients over the
// step's micro-batches (Note [gradient accumulation] in exec/executor.h), cut at the same chunks.
enum class SegmentKind { Params = 0, Grads = 1, AdamM = 2, AdamV = 3, Activations = 4, Internals = 5, GradSum = 6 };
inline constexpr int kSegmentKindCount = 7;
const char* segment_kind_name(SegmentKind kind);

struct TensorSlot {
  std::string name;                 // Hugging Face name without the layout's prefix (ParamLayout::hf_name)
  std::size_t offset_floats = 0;    // from the start of the segment
  std::vector<std::int64_t> shape;  // as stored by Hugging Face (Conv1D weights are (in, out))
  std::size_t numel = 0;
  bool weight_decay = false;        // AdamW decays tensors with >= 2 dims (weights and embeddings)
  // A slot may hold rows [row0, row0 + shape[0]) of a larger Hugging Face tensor (wte's
  // vocabulary blocks); hf_shape is the whole tensor's shape (== shape when not split).
  std::int64_t row0 = 0;
  std::vector<std::int64_t> hf_shape;
  int chunk = 0;  // the segment chunk holding it (Note [segment chunks])
  // Flat index of the slot's first element in the whole Hugging Face tensor.
  std::size_t hf_first() const {
    return shape.empty() ? 0 : static_cast<std::size_t>(row0) * (numel / static_cast<std::size_t>(shape[0]));
  }
};

enum class SegmentRole { Embed, Layer, Head, Vocab, HeadVocab, Lora };

struct SegmentLayout {
  std::string name;                 // "embed", "layer.3", "head", "wte.2", "lm_head.1"
  SegmentRole role = SegmentRole::Layer;
  int layer = -1;                   // a block segment's layer (0-based); -1 for the others
  std::vector<TensorSlot> tensors;  // in a fixed order (see BlockTensor for blocks)
  std::size_t size_floats = 0;      // padded to a multiple of 1024 floats (4 KiB)
  std::vector<std::size_t> chunk_first;  // first float of each chunk; chunk_first[0] == 0
  std::size_t size_bytes() const { return size_floats * sizeof(float); }
  int chunk_count() const { return static_cast<int>(chunk_first.size()); }
  std::size_t chunk_floats(int c) const {
    return (c + 1 < chunk_count() ? chunk_first[c + 1] : size_floats) - chunk_first[c];
  }
  // Where a tensor starts inside its chunk's buffer.
  std::size_t offset_in_chunk(const TensorSlot& t) const { return t.offset_floats - chunk_first[t.chunk]; }
  // Tensor t in a held copy of the segment (chunks: one typed view per chunk), shaped as the layout
  // says when it is a matrix.
  // An empty view when its chunk is (a group holding part of the segment, Note [block halves]).
  TensorView tensor_view(const TensorView* chunks, const TensorSlot& t) const {
    if (chunks[t.chunk].data() == nullptr) return TensorView();
    const TensorView flat = chunks[t.chunk].slice(offset_in_chunk(t), t.numel);
    return t.shape.size() == 2 ? flat.matrix(static_cast<std::size_t>(t.shape[0]), static_cast<std::size_t>(t.shape[1]))
                               : flat;
  }
};

// Order of tensors inside a GPT-2 block segment.
enum BlockTensor : int {
  kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB,
  kBlockTensorCount
};
// Order of tensors inside a Llama block segment (weights in nn.Linear layout (out, in)); a
// Qwen2 block's q, k and v biases follow (GptConfig::qkv_bias), or a Qwen3 block's q_norm and
// k_norm weights (GptConfig::qk_norm), in the attention half; Gemma 2's and 3's blocks end with
// their post-attention norm (attention half) and post-feedforward norm (MLP half) at
// llama_post_norm_slot (after Gemma 3's q_norm and k_norm), Note [gemma3] (their kMlpNormW is
// pre_feedforward_layernorm).
enum LlamaBlockTensor : int {
  kAttnNormW, kQW, kKW, kVW, kOW, kMlpNormW, kGateW, kUpW, kDownW, kLlamaBlockTensorCount,
  kQB = kLlamaBlockTensorCount, kKB, kVB,
  kQNormW = kLlamaBlockTensorCount, kKNormW
};
// The slot of a Gemma 2 or 3 block's post-attention norm (its post-feedforward norm is the next);
// -1 for a block without them (GptConfig::post_norms).
inline int llama_post_norm_slot(const GptConfig& cfg) {
  return cfg.post_norms() ? kLlamaBlockTensorCount + (cfg.qk_norm() ? 2 : 0) : -1;
}
// Note [block halves]: a block's forward is its attention half (the norm before it, q, k, v,
// the attention and its output projection, res2 = x + o(atty)) and its MLP half (the norm
// before it and the MLP, out = res2 + mlp(res2)). A zeroth-order step runs them as two groups
// (Note [zeroth-order step] in exec/executor.h) holding each half's tensors: the block
// forwards (BlockPart) then keep res2 for every row in `out` between the halves, and the same
// row chunks run the same ops on the same operands as the whole block does.
//
// Note [attention recompute first]: a recomputing backward of a frozen base's layer (LoRA) whose
// pass is one row chunk (B*T <= R) runs as two groups too: the attention half's recompute
// (every row's qkv, attention, output projection and res2 into the recomputed set: BlockPart::
// Attention, holding that half's chunks) and then the rest (BlockPart::Mlp: the MLP's recompute
// and backward, then the attention's backward, holding the whole layer). The same ops in the
// same order as the whole backward, on the same set, so the same bits; the store reads the MLP
// half while the attention recomputes, where it would otherwise wait for the whole layer.
enum class BlockPart { Whole, Attention, Mlp };
// The half tensor `tensor` of a block segment of `cfg`'s model belongs to (BlockTensor,
// LlamaBlockTensor).
inline BlockPart block_tensor_part(const GptConfig& cfg, int tensor) {
  if (cfg.llama() && cfg.post_norms() && tensor == llama_post_norm_slot(cfg) + 1)
    return BlockPart::Mlp;  // Gemma 2's and 3's post-feedforward norm (Note [gemma3])
  if (cfg.llama() && tensor >= kQB) return BlockPart::Attention;  // Qwen2's biases, q/k norms, the post-attention norm
  return tensor < (cfg.llama() ? static_cast<int>(kMlpNormW) : static_cast<int>(kLn2W)) ? BlockPart::Attention
                                                                                         : BlockPart::Mlp;
}
enum EmbedTensor : int { kWpe };             // GPT-2 only
enum HeadTensor : int { kLnFW, kLnFB };      // Llama: model.norm.weight only
// Rows of one vocabulary block: at most kVocabBlockFloats floats, and at least kMinVocabBlocks
// blocks (so small models exercise the blocking too).
inline constexpr std::size_t kChunkFloats = std::size_t{1} << 20;  // 4 MiB
inline constexpr std::size_t kVocabBlockFloats = std::size_t{1} << 19;  // 2 MiB
inline constexpr int kMinVocabBlocks = 4;
int vocab_block_rows(const GptConfig& config);

class ParamLayout {
 public:
  static ParamLayout gpt2(const GptConfig& config);
  static ParamLayout llama(const GptConfig& config);
  static ParamLayout of(const GptConfig& config);  // by config.arch
  // With adapters (lora.on(): Note [lora segments]); lora is validated first.
  static ParamLayout of(const GptConfig& config, const LoraConfig& lora);

  const std::vector<SegmentLayout>& segments() const { return segments_; }
  int segment_count() const { return static_cast<int>(segments_.size()); }
  int embed_segment() const { return 0; }
  int layer_segment(int layer) const { return 1 + layer; }
  int head_segment() const { return head_segment_; }
  int vocab_block_count() const { return vocab_blocks_; }
  int vocab_segment(int block) const { return head_segment_ + 1 + block; }
  // The LM head's vocabulary block: the token embedding's when tied, else lm_head's own.
  bool head_tied() const { return head_tied_; }
  ModelArch arch() const { return arch_; }
  const char* family_title() const { return family_title_; }  // GptConfig::family_title: for messages
  int head_vocab_segment(int block) const {
    return head_tied_ ? vocab_segment(block) : head_segment_ + 1 + vocab_blocks_ + block;
  }
  // The Hugging Face tensor name of a slot: "transformer." + name for GPT-2, name for Llama.
  std::string hf_name(const TensorSlot& t) const { return hf_prefix_ + t.name; }
  int vocab_block_rows() const { return vocab_rows_; }
  // First vocabulary row and row count of a block.
  int vocab_row0(int block) const { return block * vocab_rows_; }
  int vocab_rows(int block) const;
  std::size_t num_params() const;  // real parameters, without padding
  std::size_t num_trainable_params() const;  // of the trainable segments

  // LoRA (Note [lora segments]).
  const LoraConfig& lora() const { return lora_; }
  bool has_lora() const { return lora_.on(); }
  int lora_segment(int layer) const { return lora_first_ + layer; }
  // Slot of module k's lora_A in its lora segment (lora_B follows it); -1 when not adapted.
  int lora_slot(int k) const { return lora_slot_[k]; }
  // Projection k's first row of its module's lora_B: 0, or a fused module's later part's (Note
  // [fused lora] in model/lora.h: q, k, v at 0, Q and Q + KV of qkv_proj's).
  int lora_b_row0(int k) const { return lora_b_row0_[k]; }
  // Whether a segment's parameters are trained (everything, or with LoRA the adapters only).
  bool trainable(int s) const { return !lora_.on() || segments_[s].role == SegmentRole::Lora; }
  // Whether the blocks' MLP halves have nothing to train: LoRA with no adapter on them (Note
  // [frozen MLP rows] in model/block_policy.h).
  bool mlp_frozen() const;
  // Every slot holding (part of) a tensor by Hugging Face name (with or without GPT-2's prefix
  // "transformer.", and a multimodal Gemma 3's "language_model.", Note [gemma3 multimodal]), as
  // (segment, tensor) pairs in row order; empty if unknown.
  std::vector<std::pair<int, int>> find(std::string_view hf_name) const;

 private:
  // Appends the vocabulary blocks of tensor (V, C) as segments "<segment>.k".
  void vocab_blocks_add(const std::string& segment, const std::string& tensor, SegmentRole role, const GptConfig& cfg);

  std::vector<SegmentLayout> segments_;
  int head_segment_ = 0;
  int vocab_rows_ = 0;
  int vocab_size_ = 0;
  int vocab_blocks_ = 0;
  bool head_tied_ = true;
  ModelArch arch_ = ModelArch::Gpt2;
  const char* family_title_ = "GPT-2";
  std::string hf_prefix_;
  // GptConfig::weights_prefix: optional on the names find() takes, at their start or after "model."
  std::string load_prefix_;
  LoraConfig lora_;
  int lora_first_ = -1;
  std::array<int, kLoraMaxTargets> lora_slot_{-1, -1, -1, -1, -1, -1, -1};
  std::array<int, kLoraMaxTargets> lora_b_row0_{};
  LoraFamily lora_family_ = LoraFamily::Gpt2;
};

}  // namespace stratum
