// Moving GPT-2 and Llama weights (and, for checkpoints, AdamW's moments) between Hugging Face
// directories (config.json + model.safetensors, or shards named by model.safetensors.index.json;
// F32, F16 or BF16) and the segment store, and initialising a new model. Saving always writes
// one F32 model.safetensors (the master weights, exactly). Does not touch gradients.
#pragma once

#include <cstdint>
#include <map>
#include <functional>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/param_layout.h"
#include "store/segment_store.h"

namespace stratum {

class ThreadPool;

// Reads DIR/config.json (GPT-2 or Llama).
GptConfig model_read_config(const std::string& dir);

// The weight files of DIR: model.safetensors, else the shards model.safetensors.index.json names
// (each must exist; weight_map, when not null, receives the index's tensor -> shard file map).
std::vector<std::string> model_weight_files(const std::string& dir, std::map<std::string, std::string>* weight_map);

// Loads DIR's weights (model_weight_files) into the Params segments, converting F16/BF16/F64 to
// F32 (or, into a store with units().param_bf16(), BF16 as stored and anything else rounded to
// bf16, nearest-even). GPT-2 names may carry the "transformer." prefix or not (a multimodal Gemma
// 3's its "language_model.", Note [gemma3 multimodal]); "h.{i}.attn.bias"/"attn.masked_bias"
// buffers, Llama's "rotary_emb.inv_freq", a tied model's "lm_head.weight" and a multimodal Gemma
// 3's vision tower and projector are ignored. Any
// missing tensor, wrong shape, tensor outside its indexed shard or index entry absent from its
// shard is an error naming it.
void model_load_weights(const std::string& dir, const ParamLayout& layout, SegmentStore& store);
// The same checks of names, shapes, dtypes and shards, reading headers only (`stratum info`).
void model_check_weights(const std::string& dir, const ParamLayout& layout);
// Whether every weight DIR holds (model_weight_files, ignoring what model_load_weights ignores) is
// BF16 (false for a directory without weights, e.g. a config alone). A store whose
// units().param_bf16() loads them unconverted (Note [bf16 weights] in infer/decoder.h).
bool model_weights_bf16(const std::string& dir);

// Initialisation from a seed. GPT-2: weights N(0, 0.02) (residual projections N(0, 0.02/sqrt(2L))),
// biases 0, LayerNorm weight 1 / bias 0. Llama (as transformers does): every weight N(0, 0.02),
// RMSNorm weights 1. Same seed => same bits: the values are those of one Rng stream taken in
// tensor order, made in fixed 64Ki-value pieces on `pool` when given (Rng::skip; any thread count).
void model_init_random(const GptConfig& cfg, const ParamLayout& layout, SegmentStore& store, std::uint64_t seed,
                       ThreadPool* pool = nullptr);

// Writes a Hugging Face directory loadable by GPT2LMHeadModel / LlamaForCausalLM: config.json and
// model.safetensors (GPT-2 names with "transformer.", lm_head tied, so absent; Llama names as
// transformers writes them, lm_head.weight when untied), plus the tokenizer files found in
// tokenizer_dir when it is non-empty (tokenizer.json, tokenizer_config.json, vocab.json +
// merges.txt, or encoder.json + vocab.bpe saved as the latter two). The directory is built under a
// temporary name, fsynced and swapped in atomically, so `dir` always holds either the previous
// complete model or the new one. dtype: the weights as F32, or as BF16 (rounded nearest-even,
// torch_dtype bfloat16: stratum merge over a bf16 base, as PEFT's merge into bf16 weights).
// model_dir, when it holds one: the source model's generation_config.json, copied beside
// (Note [generation config] in model/hf_config.h).
void model_save(const std::string& dir, const GptConfig& cfg, const ParamLayout& layout, SegmentStore& store,
                const std::string& tokenizer_dir, DType dtype = DType::F32, const std::string& model_dir = "");

// The files of a Hugging Face directory (config.json, model.safetensors and the tokenizer files
// from tokenizer_dir when non-empty, as model_save) written into the existing directory `dir`
// (each file atomically), and model_dir's generation_config.json when it has one; model_save and
// checkpoints build on it. weights false: no model.safetensors (a LoRA checkpoint: the base's
// config and tokenizer beside the adapter).
// Only the base's segments are written (adapters: weights/adapter_io.h).
void model_write_files(const std::string& dir, const GptConfig& cfg, const ParamLayout& layout, SegmentStore& store,
                       const std::string& tokenizer_dir, bool weights = true, DType dtype = DType::F32,
                       const std::string& model_dir = "");

// AdamW's moments as a safetensors file: "HF_NAME.exp_avg" and ".exp_avg_sq" (F32, the
// parameter's Hugging Face shape), written one chunk at a time; loading checks every tensor is
// there with its shape, like model_load_weights. A checkpoint holds them as optimizer.safetensors
// (one process) or as one shard per data-parallel rank, optimizer_shard_name(r, P), each with the
// whole tensors of the segments rank r updates (Note [zero sharding] in exec/executor.h); either
// form loads on any number of ranks.
// keep (may be null): only the trainable segments it keeps (a rank's shard).
void optimizer_write_file(const std::string& path, const ParamLayout& layout, SegmentStore& store,
                          const std::function<bool(int)>* keep = nullptr);
// "optimizer-00001-of-00002.safetensors" for shard 0 of 2 (Hugging Face's sharded names).
std::string optimizer_shard_name(int shard, int shards);
// Whether `name` is exactly such a name; shard (0-based) and shards when it is.
bool optimizer_shard_parse(const std::string& name, int* shard, int* shards);
// The optimizer files among a checkpoint's file names: {"optimizer.safetensors"}, or a complete
// set of shards in order; empty when neither is there.
std::vector<std::string> optimizer_files(const std::vector<std::string>& names);
// Loads the moments of checkpoint directory `dir` from its optimizer files (either form). keep
// (may be null): the trainable segments whose moments this process holds (Note [zero sharding]);
// the others' are only checked.
void optimizer_load(const std::string& dir, const ParamLayout& layout, SegmentStore& store,
                    const std::function<bool(int)>* keep = nullptr);

// 64-bit FNV-1a hash of all parameters (the bits, in layout order): equal hashes = identical models.
std::uint64_t model_params_hash(const ParamLayout& layout, SegmentStore& store);

}  // namespace stratum
