// `stratum merge`: a base model and a PEFT LoRA adapter folded into one Hugging Face directory
// (w += s * B A in each adapted linear, as PEFT's merge_and_unload). Holds the model in RAM (fp32);
// writes the merged weights in the base's dtype (BF16 for a bf16 base, else F32) with the base's
// config and tokenizer files.
#include <cstdio>
#include <filesystem>
#include <string>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/file_util.h"
#include "core/thread_pool.h"
#include "model/transformer_block.h"
#include "store/segment_store.h"
#include "train/checkpoint.h"
#include "stratum/error.h"
#include "weights/adapter_io.h"
#include "weights/model_io.h"

namespace stratum {

int cmd_merge(const std::vector<std::string>& argv) {
  Args args("merge", argv,
            {{"model", "DIR", "the base model (a Hugging Face model directory) the adapter was trained on"},
             {"adapter", "DIR", "a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), "
                                "e.g. a stratum train --lora-r checkpoint"},
             {"out", "DIR", "where to write the merged model (a new directory, or an earlier merge's output, replaced atomically)"},
             {"threads", "N", "worker threads (default: STRATUM_THREADS or all CPUs)"}});
  if (args.help_requested()) {
    std::fputs(args.help_text("stratum merge --model BASE --adapter DIR --out DIR").c_str(), stdout);
    return 0;
  }
  for (const char* required : {"model", "adapter", "out"})
    STRATUM_CHECK(args.has(required), "[merge] --", required, " DIR is required (stratum merge --model BASE "
                  "--adapter DIR --out DIR)");
  const std::string base_dir = model_dir_resolve(args.str("model"));
  const std::string adapter_dir = model_dir_resolve(args.str("adapter"));  // a checkpoint root: its newest
  checkpoint_dir_check(adapter_dir, "merge");
  for (const std::string& input : {base_dir, adapter_dir})
    STRATUM_CHECK(!same_file(args.str("out"), input), "[merge] --out '", args.str("out"), "' is an input (", input,
                  "); choose a new directory");
  // Not inside a checkpoint or a --save root: pruning (--keep) would delete it with them.
  std::error_code ec;
  for (std::filesystem::path p = std::filesystem::absolute(args.str("out"), ec).lexically_normal();
       !ec && p.has_relative_path(); p = p.parent_path()) {
    const std::string dir = p.string();
    STRATUM_CHECK(!file_exists(dir + "/manifest.json") && !file_exists(dir + "/latest"), "[merge] --out '",
                  args.str("out"), "' is inside ", dir, ", a checkpoint or --save directory whose pruning would delete "
                  "it; choose a directory outside it");
  }
  const GptConfig cfg = model_read_config(base_dir);
  const LoraConfig lora = adapter_config_read(adapter_dir, lora_family(cfg));
  const ParamLayout layout = ParamLayout::of(cfg, lora);
  RamSegmentStore store(layout);
  model_load_weights(base_dir, layout, store);
  adapter_load_weights(adapter_dir, layout, store);
  const int threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  ThreadPool pool(threads > 0 ? threads : default_thread_count());
  backend_set_threads(pool.num_threads());
  const std::unique_ptr<Ops> ops = ops_make(pool);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const int s = layout.layer_segment(l), a = layout.lora_segment(l);
    SegmentChunksHold base(store, s, SegmentKind::Params, Access::Update);
    SegmentChunksHold adapter(store, a, SegmentKind::Params, Access::Read);
    const LoraBlock block =
        lora_block_of(layout, LoraChunks{&layout.segments()[a], adapter.chunks(), nullptr});
    for (int k = 0; k < kLoraMaxTargets; ++k) {
      if (block.t[k].a == nullptr) continue;
      const auto [in, out] = lora_module_dims(cfg, k);
      const TensorSlot& w = layout.segments()[s].tensors[lora_base_slot(cfg.arch, k)];
      lora_merge(*ops, block, k, base.tensor(w), !cfg.llama(), in, out);
    }
  }
  // A bf16 base gets bf16 merged weights (w + s B A in fp32, rounded once), as PEFT's merge into
  // bf16 weights; anything else F32.
  const bool bf16 = model_weights_bf16(base_dir);
  model_save(args.str("out"), cfg, layout, store, base_dir, bf16 ? DType::BF16 : DType::F32, base_dir);
  std::fprintf(stderr, "[stratum] merged %s (r=%d, alpha %g on %s) into %s: %s (%s, as the base)\n",
               adapter_dir.c_str(), lora.r, lora.alpha, lora_targets_text(lora).c_str(), base_dir.c_str(),
               args.str("out").c_str(), bf16 ? "bf16" : "fp32");
  return 0;
}

}  // namespace stratum
