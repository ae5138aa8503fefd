// Moving GPT-2 weights (and, for checkpoints, AdamW's moments) between Hugging Face directories
// (config.json + model.safetensors) and the segment store, and initialising a new model. Does not
// touch gradients.
#pragma once

#include <cstdint>
#include <string>

#include "model/model_config.h"
#include "model/param_layout.h"
#include "store/segment_store.h"

namespace stratum {

// Reads DIR/config.json (GPT-2 only).
GptConfig model_read_config(const std::string& dir);

// Loads DIR/model.safetensors into the Params segments. Names may carry the "transformer."
// prefix or not; "h.{i}.attn.bias"/"attn.masked_bias" buffers and a tied "lm_head.weight" are
// ignored. Any missing tensor or wrong shape is an error naming it.
void model_load_weights(const std::string& dir, const ParamLayout& layout, SegmentStore& store);

// GPT-2 initialisation from a seed: weights N(0, 0.02) (residual projections N(0, 0.02/sqrt(2L))),
// biases 0, LayerNorm weight 1 / bias 0. Same seed => same bits.
void model_init_random(const GptConfig& cfg, const ParamLayout& layout, SegmentStore& store, std::uint64_t seed);

// Writes a Hugging Face GPT-2 directory loadable by GPT2LMHeadModel: config.json and
// model.safetensors (names with "transformer.", lm_head tied, so absent), plus vocab.json and
// merges.txt copied from tokenizer_dir when it is non-empty. The directory is built under a
// temporary name, fsynced and swapped in atomically, so `dir` always holds either the previous
// complete model or the new one.
void model_save(const std::string& dir, const GptConfig& cfg, const ParamLayout& layout, SegmentStore& store,
                const std::string& tokenizer_dir);

// The files of a Hugging Face GPT-2 directory (config.json, model.safetensors, and vocab.json +
// merges.txt from tokenizer_dir when non-empty) written into the existing directory `dir`
// (each file atomically); model_save and checkpoints build on it.
void model_write_files(const std::string& dir, const GptConfig& cfg, const ParamLayout& layout, SegmentStore& store,
                       const std::string& tokenizer_dir);

// AdamW's moments as a safetensors file: "transformer.NAME.exp_avg" and ".exp_avg_sq" (F32, the
// parameter's Hugging Face shape), written one chunk at a time; loading checks every tensor is
// there with its shape, like model_load_weights.
void optimizer_write_file(const std::string& path, const ParamLayout& layout, SegmentStore& store);
void optimizer_load_file(const std::string& path, const ParamLayout& layout, SegmentStore& store);

// 64-bit FNV-1a hash of all parameters (the bits, in layout order): equal hashes = identical models.
std::uint64_t model_params_hash(const ParamLayout& layout, SegmentStore& store);

}  // namespace stratum
