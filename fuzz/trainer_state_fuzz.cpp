// libFuzzer target for the checkpoint trainer state reader (trainer_state.json): parses the input
// as text with trainer_state_parse. An accepted state must round-trip (trainer_state_json, parsed
// again, gives the same JSON) and keep the parser's promises: 1 <= step <= total_steps, batch,
// seq, keep, eval_batches, train_tokens and the model dimensions >= 1, the step counts >= 0, a
// known lr_schedule, a non-empty data_path. An input starting with the byte 'F' instead goes
// (without the 'F') to file_fault_parse (the STRATUM_FILE_FAULT spec), whose accepted values must
// be KIND@TEXT with a known KIND and a non-empty TEXT. Caps its stack at 128 KiB (Note [fuzz
// stack limit] in fuzz_file.h).
// Pass: success or stratum::Error. Fail: any other exception, a BugError, a round trip that
// fails or differs, a broken promise, or a sanitizer report. Run with tools/fuzz.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/file_util.h"
#include "fuzz_file.h"
#include "model/model_config.h"
#include "stratum/error.h"
#include "train/checkpoint.h"

namespace {

[[noreturn]] void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "[fuzz.trainer_state] %s\n", what.c_str());
  std::abort();
}

// The second parser: STRATUM_FILE_FAULT="KIND@TEXT".
void file_fault_check(const std::string& spec) {
  stratum::FileFault fault;
  try {
    fault = stratum::file_fault_parse(spec);
  } catch (const stratum::BugError& e) {
    fuzz_fail(std::string("file_fault_parse: internal assertion: ") + e.what());
  } catch (const stratum::Error&) {
    return;  // rejected spec
  } catch (const std::exception& e) {
    fuzz_fail(std::string("file_fault_parse: unexpected exception: ") + e.what());
  }
  const char* kind = nullptr;
  switch (fault.kind) {
    case stratum::FileFault::Kind::Enospc: kind = "enospc"; break;
    case stratum::FileFault::Kind::Eio: kind = "eio"; break;
    case stratum::FileFault::Kind::Kill: kind = "kill"; break;
    case stratum::FileFault::Kind::None: fuzz_fail("file_fault_parse accepted a spec as kind None");
  }
  if (fault.match.empty()) fuzz_fail("file_fault_parse accepted an empty TEXT");
  if (spec != std::string(kind) + "@" + fault.match)
    fuzz_fail("file_fault_parse: the spec is not KIND@TEXT of what it returned (kind " + std::string(kind) +
              ", text '" + fault.match.substr(0, 60) + "')");
}

void state_check(const stratum::TrainerState& s) {
  if (s.steps < 1 || s.step < 1 || s.step > s.steps)
    fuzz_fail("accepted step " + std::to_string(s.step) + " of total_steps " + std::to_string(s.steps));
  if (s.batch < 1 || s.seq < 1 || s.keep < 1)
    fuzz_fail("accepted batch " + std::to_string(s.batch) + ", seq " + std::to_string(s.seq) + ", keep " +
              std::to_string(s.keep));
  const stratum::GptConfig& c = s.config;
  if (c.n_layer < 1 || c.n_head < 1 || c.n_embd < 1 || c.n_ctx < 1 || c.vocab_size < 1)
    fuzz_fail("accepted a model dimension below 1: n_layer " + std::to_string(c.n_layer) + ", n_head " +
              std::to_string(c.n_head) + ", n_embd " + std::to_string(c.n_embd) + ", n_ctx " +
              std::to_string(c.n_ctx) + ", vocab_size " + std::to_string(c.vocab_size));
  if (s.eval_batches < 1 || s.train_tokens < 1 || s.lr.warmup_steps < 0 || s.eval_every < 0 || s.save_every < 0)
    fuzz_fail("accepted eval_batches " + std::to_string(s.eval_batches) + ", train_tokens " +
              std::to_string(s.train_tokens) + ", warmup_steps " + std::to_string(s.lr.warmup_steps) +
              ", eval_every " + std::to_string(s.eval_every) + ", save_every " + std::to_string(s.save_every));
  if (s.lr.kind != stratum::LrScheduleKind::Constant && s.lr.kind != stratum::LrScheduleKind::Cosine)
    fuzz_fail("accepted an lr_schedule that is neither constant nor cosine");
  if (s.data_path.empty()) fuzz_fail("accepted an empty data_path");
}

}  // namespace

// Caps the stack: see Note [fuzz stack limit] in fuzz_file.h.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  stratum::fuzz::fuzz_cap_stack();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!text.empty() && text[0] == 'F') {  // never valid JSON: the file fault parser's inputs
    file_fault_check(text.substr(1));
    return 0;
  }
  // What the trainer writes must read back as the same state.
  stratum::fuzz::fuzz_parse_and_round_trip(text, "state", stratum::trainer_state_parse, stratum::trainer_state_json,
                                           state_check, fuzz_fail);
  return 0;
}
