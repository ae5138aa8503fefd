// `stratum generate`: autoregressive sampling with a KV cache (infer/decoder.h) from a GPT-2 or
// Llama model, in RAM or with the weights streamed from the offload dir under a memory budget.
// One prompt streams its text as each token is chosen; many prompts (throughput mode) run in
// batches that share each streamed layer, sequences advancing in lockstep (a batch whose prompts
// are all still being read takes as many prompt tokens per step as the shortest has left; once
// any sequence generates, every step takes one token per sequence). Prompts are text (encoded
// by the model's tokenizer) or token ids.
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ops/ops.h"

namespace stratum {

struct GenerateOptions {
  std::string model_dir;
  std::string adapter_dir;    // a PEFT LoRA adapter applied unmerged (weights/adapter_io.h); empty = none
  std::string tokenizer_dir;  // default: the model directory's tokenizer files
  std::vector<std::string> prompts;                 // text prompts (one = streaming mode)
  std::vector<std::vector<std::int32_t>> prompt_ids;  // or token-id prompts (no tokenizer needed)
  // Text prompts get the BOS the tokenizer adds (as tokenizer(text) does); false for a rendered
  // chat template, which writes the BOS it wants (apply_chat_template's add_special_tokens=False).
  bool add_bos = true;
  // Note [next turn]: with one text prompt, after its sequence stops (an end token, max_tokens) the
  // generator calls next_turn(next): `next` gets the whole next input as text (an interactive
  // chat's conversation re-rendered with the next user message), encoded as the prompt was, and
  // true continues, false ends. The decoder keeps its KV cache for the longest prefix the new ids
  // share with the sequence so far and reads the rest, so a turn reads its new tokens only (from
  // where the template rewrote earlier text, if it did); max_tokens counts per turn. The KV cache
  // then holds `context` tokens (0: the model's context) and an input that does not fit is refused.
  std::function<bool(std::string& next)> next_turn;
  int context = 0;
  int batch = 1;              // sequences decoded together (throughput mode)
  int max_tokens = 64;        // per sequence
  double temperature = 1.0;   // 0 = greedy
  int top_k = 0;              // 0 = no top-k filter
  double top_p = 1.0;         // 1 = no nucleus filter
  double repetition_penalty = 1.0;  // Note [repetition penalty]; 1 = none
  std::uint64_t seed = 1337;
  int threads = 0;
  bool stop_at_eos = true;
  // When set and it becomes non-zero (a signal handler), generation stops after the current step
  // and returns what it has, with `interrupted` set (the store's offload files are removed).
  const volatile std::sig_atomic_t* stop_requested = nullptr;
  std::uint64_t mem_budget_bytes = 0;  // 0 = weights in RAM
  std::string offload_dir;
  int prefetch = 2;
  bool quiet = false;  // no "[stratum]" lines on stderr
  // A model whose weights are all bf16 keeps them bf16 (Note [bf16 weights] in infer/decoder.h);
  // false widens them to fp32 on load: twice the RAM and reads, the same tokens.
  bool keep_bf16 = true;
  // Bf16: the weights (GPT-2 or Llama) are rounded to bf16 on load and kept so (Note [bf16
  // weights]): half the RAM and reads; the products sum bf16 weights times fp32 activations in fp32.
  Precision precision = Precision::Fp32;
  // A Chrome/Perfetto trace of the run (each layer's compute, waits, each unit read or written);
  // "" = none.
  std::string trace_path;
  // Where the decoder computes (backend/backend.h): Cuda reads the weights and KV caches from the
  // device tier (DeviceSegmentStore, Note [device tier]) over the RAM or tiered store and samples
  // on the host from the downloaded logits.
  Backend backend = Backend::Cpu;
  // --gpu-mem-budget: device memory for the decoder's buffers and the units it holds (0 = all the
  // weights and KV caches on the device); the rest is copied in as the decode schedule needs it.
  std::size_t gpu_mem_budget_bytes = 0;
  bool device_tier_on_cpu = false;  // tests only: decode through a device tier on the CPU backend
};

struct GenerateSequence {
  std::vector<std::int32_t> prompt;  // ids
  std::vector<std::int32_t> tokens;  // generated ids (without the prompt; the EOS that stopped it excluded)
  std::string text;                  // decoded generated text ("" without a tokenizer)
  bool stopped_at_eos = false;
  bool stopped_at_context = false;   // the model's context filled up before --max-tokens
};

struct GenerateResult {
  std::vector<GenerateSequence> sequences;  // in prompt order
  bool has_tokenizer = true;  // false: ids prompts to a model without one (the texts are empty)
  bool interrupted = false;   // stopped early by stop_requested
  long prompt_tokens = 0, generated_tokens = 0;
  double prompt_tokens_per_s = 0.0;     // prompt tokens / time of the steps that read only prompt tokens
  // Tokens sampled by the other steps / their time (a sequence's first token comes from its last
  // prompt step, so it counts toward neither rate).
  double generate_tokens_per_s = 0.0;
  double prompt_seconds = 0.0, generate_seconds = 0.0;
  double tokens_per_s = 0.0;            // generated_tokens / the whole generation time (compat)
  std::uint64_t read_bytes = 0;         // weights (and spilled KV cache) read from the offload dir (budget only)
  std::uint64_t write_bytes = 0;        // KV cache written to the offload dir (budget only)
  std::size_t peak_ram_bytes = 0;       // store + decoder (budget only)
  double read_busy_seconds = 0.0;       // wall time with a read in flight (budget only)
  double stall_seconds = 0.0;           // time the decoder waited for reads or space (budget only)
  // The device tier (--gpu-mem-budget): bytes copied host -> device and back during generation,
  // and the decoder's buffers + the units held on the device at the most.
  std::uint64_t device_read_bytes = 0, device_write_bytes = 0;
  std::size_t device_peak_bytes = 0;
  std::size_t device_min_bytes = 0;     // the smallest --gpu-mem-budget this run could use
  bool weights_bf16 = false;            // the weights were kept in bf16 (GenerateOptions::keep_bf16)
  std::size_t weight_bytes = 0;         // the weights as the store holds them
  // The KV caches (Note [KV cache units]), and what they would be if sliding layers held every
  // position (Note [sliding KV cache]); max_ctx: the positions a sequence may reach.
  std::size_t kv_cache_bytes = 0, kv_cache_whole_bytes = 0;
  int max_ctx = 0;
};

// on_token(sequence index, id, text) for every generated token, in order (text "" without a
// tokenizer).
GenerateResult generate_run(const GenerateOptions& options,
                            const std::function<void(int, std::int32_t, const std::string&)>& on_token);

// Picks the next token from logits (V): argmax when temperature == 0 (lowest id on ties), else
// samples softmax(logits / temperature) restricted to the top_k largest (ties by lower id) and
// then to the smallest set of most likely tokens whose probability reaches top_p. logits are in
// host memory: `ops` must be a CPU backend's (its softmax_row).
std::int32_t sample_next_token(const Ops& ops, const float* logits, int V, double temperature, int top_k, double uniform01,
                               double top_p = 1.0);

// Note [repetition penalty]: transformers' RepetitionPenaltyLogitsProcessor (CTRL's penalty),
// which Qwen2.5's generation_config.json asks for (1.05): before the temperature, top-k and
// top-p, and in greedy decoding too, the logit of every token id already in the sequence (the
// prompt, its BOS included, and the tokens generated) is divided by the penalty when it is
// positive and multiplied by it otherwise, in fp32 (the penalty rounded to float, as torch's
// division of a float32 tensor by a Python float), each id once however often it occurs.
// out (V) = logits with that penalty (each written from logits[id], as transformers' gather and
// scatter: an id seen twice is penalized once); out must not alias logits. ids [0, n) below V;
// penalty > 0 (1: no change).
void repetition_penalize(float* out, const float* logits, int V, const std::int32_t* ids, std::size_t n,
                         double penalty);

// The seed of prompt `prompt`'s sampling stream (its index among the run's prompts) under --seed:
// a hash of both, so a prompt samples the same tokens in any batch, and no (seed, prompt) pair
// shares another's stream (with seed + prompt, seed 2's first prompt was seed 1's second).
std::uint64_t sample_stream_seed(std::uint64_t seed, std::uint64_t prompt);

}  // namespace stratum
