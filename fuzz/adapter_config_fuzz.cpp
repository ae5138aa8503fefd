// libFuzzer target for the PEFT adapter_config.json reader (weights/adapter_io.h): parses the
// input as a GPT-2 and as a Llama adapter config. An accepted config must have r > 0, a finite
// alpha > 0, a dropout in [0, 1) and targets that build a layout with adapters for a small model
// of that family. Caps its stack at 128 KiB (Note [fuzz stack limit] in fuzz_file.h).
// Pass: success or stratum::Error. Fail: any other exception, a BugError, an accepted config that
// breaks the checks above, or a sanitizer report. Does not fuzz the writer. Run with tools/fuzz.sh.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_file.h"
#include "model/param_layout.h"
#include "stratum/error.h"
#include "weights/adapter_io.h"

namespace {

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.adapter_config] %s\n", what.c_str());
  std::abort();
}

// A tiny model of the family (Phi-3: Llama's shape with its fused projections).
stratum::GptConfig small(stratum::LoraFamily family) {
  stratum::GptConfig cfg;
  cfg.arch = family == stratum::LoraFamily::Gpt2 ? stratum::ModelArch::Gpt2 : stratum::ModelArch::Llama;
  if (family == stratum::LoraFamily::Phi3) cfg.variant = stratum::LlamaVariant::Phi3;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  cfg.n_ctx = 8;
  cfg.vocab_size = 11;
  if (cfg.llama()) cfg.tie_word_embeddings = false;
  return cfg;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stratum::fuzz::fuzz_cap_stack();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (stratum::LoraFamily family : {stratum::LoraFamily::Gpt2, stratum::LoraFamily::Llama, stratum::LoraFamily::Phi3}) {
    stratum::LoraConfig lora;
    try {
      lora = stratum::adapter_config_parse(text, "adapter_config.json", family);
    } catch (const stratum::BugError& e) {
      fuzz_fail(std::string("internal assertion: ") + e.what());
    } catch (const stratum::Error&) {
      continue;  // rejected input: the expected outcome for most fuzz inputs
    }
    if (lora.r <= 0 || !(lora.alpha > 0) || !std::isfinite(lora.alpha) || !(lora.dropout >= 0 && lora.dropout < 1))
      fuzz_fail("accepted r " + std::to_string(lora.r) + ", alpha " + std::to_string(lora.alpha) + ", dropout " +
                std::to_string(lora.dropout));
    if (lora.r > 64) continue;  // a valid rank; the layout below would only be large
    try {
      const stratum::ParamLayout layout = stratum::ParamLayout::of(small(family), lora);
      if (!layout.has_lora() || layout.num_trainable_params() == 0) fuzz_fail("accepted config adapts nothing");
    } catch (const stratum::Error& e) {
      fuzz_fail(std::string("accepted a config the layout rejects: ") + e.what());
    }
  }
  return 0;
}
