// The option table (Note [option table]) and the operations every user of it shares.
#include "core/hash.h"
#include "train/train_options.h"

#include <cstdio>
#include <limits>
#include <type_traits>
#include <utility>

#include "stratum/error.h"

namespace stratum {

namespace {
constexpr double kMaxSteps = 1e9;
constexpr double kBig = 1e30;
constexpr double kMaxSeed = static_cast<double>(std::numeric_limits<std::int64_t>::max());

const char* lr_kind_name(LrScheduleKind kind) { return kind == LrScheduleKind::Constant ? "constant" : "cosine"; }

std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

// The field of `option` in a const settings object (the table's accessors take a mutable one).
TrainOptionField field_of(const TrainOption& option, const TrainSettings& s) {
  return option.field(const_cast<TrainSettings&>(s));
}

const TrainOption kTable[] = {
    {"data", "data_path", "FILE", "training data: text (with --tokenizer), .bin uint16 tokens or llm.c shard", 1, 0,
     false, [](TrainSettings& s) -> TrainOptionField { return &s.data_path; }},
    {"val-data", "val_data_path", "FILE", "validation data (default: hold out the last 5% when --eval-every > 0)", 0,
     0, false, [](TrainSettings& s) -> TrainOptionField { return &s.val_data_path; }},
    {"tokenizer", "tokenizer_dir", "DIR", "tokenizer files (tokenizer.json, encoder.json + vocab.bpe or vocab.json + merges.txt)", 0,
     0, false, [](TrainSettings& s) -> TrainOptionField { return &s.tokenizer_dir; }},
    {"batch", "batch", "B", "sequences per step", 1, 65536, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.batch; }},
    {"seq", "seq", "T", "tokens per sequence", 1, 1 << 20, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.seq; }},
    {"grad-accum", "grad_accum", "N",
     "micro-batches of B sequences per optimizer step: gradients summed in micro-batch order, global batch N*B, "
     "loss the mean over it (memory of one micro-batch, plus one more gradient copy)",
     1, 65536, true, [](TrainSettings& s) -> TrainOptionField { return &s.grad_accum; }, true},
    {"steps", "total_steps", "S", "optimizer steps (the LR schedule's length)", 1, kMaxSteps, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.steps; }},
    {"lr", "max_lr", "X", "peak learning rate", 0, kBig, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.lr.max_lr; }},
    {"lr-schedule", "lr_schedule", "NAME", "constant | cosine", 0, 0, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.lr.kind; }},
    {"warmup", "warmup_steps", "N", "linear warmup steps", 0, kMaxSteps, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.lr.warmup_steps; }},
    {"min-lr", "min_lr", "X", "final learning rate of the cosine schedule", 0, kBig, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.lr.min_lr; }},
    {"beta1", "beta1", "X", "AdamW beta1", 0, 1, true, [](TrainSettings& s) -> TrainOptionField { return &s.beta1; }},
    {"beta2", "beta2", "X", "AdamW beta2", 0, 1, true, [](TrainSettings& s) -> TrainOptionField { return &s.beta2; }},
    {"eps", "eps", "X", "AdamW epsilon", 0, kBig, true, [](TrainSettings& s) -> TrainOptionField { return &s.eps; }},
    {"weight-decay", "weight_decay", "X", "AdamW decoupled weight decay on weights and embeddings", 0, kBig, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.weight_decay; }},
    {"grad-clip", "grad_clip", "X", "clip the global gradient norm to X; 0 = off", 0, kBig, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.grad_clip; }},
    {"seed", "seed", "N", "initialisation and shuffling seed", 0, kMaxSeed, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.seed; }},
    {"shuffle", "shuffle", "", "visit batches in a seeded random order each epoch", 0, 0, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.shuffle; }},
    {"eval-every", "eval_every", "N", "validation loss every N steps; 0 = off", 0, kMaxSteps, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.eval_every; }},
    {"eval-batches", "eval_batches", "N", "batches per validation", 1, 1e6, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.eval_batches; }},
    {"save-every", "save_every", "N", "also checkpoint every N steps; 0 = at the end only", 0, kMaxSteps, false,
     [](TrainSettings& s) -> TrainOptionField { return &s.save_every; }},
    {"keep", "keep", "K", "checkpoints kept under --save, the newest", 1, 1e6, false,
     [](TrainSettings& s) -> TrainOptionField { return &s.keep; }},
    {"precision", "precision", "P",
     "fp32 | bf16: matrix products on bfloat16-rounded operands summed in fp32 (about twice as fast on CPUs with "
     "AVX-512 BF16); weights, AdamW, norms, softmax and the loss stay fp32",
     0, 0, true, [](TrainSettings& s) -> TrainOptionField { return &s.precision; }},
    {"optimizer", "optimizer", "NAME",
     "adamw | zo-sgd: zeroth-order SGD (MeZO): per step two forward passes with the weights moved by +-zo_eps*z, "
     "then w -= lr*(g*z + weight_decay*w) with g the loss difference over 2*zo_eps; no backward, no gradients or "
     "moments kept (the beta, eps and grad-clip options do not apply)",
     0, 0, true, [](TrainSettings& s) -> TrainOptionField { return &s.optimizer; }, true},
    {"zo-eps", "zo_eps", "X", "zo-sgd's perturbation scale", 1e-12, 1e3, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.zo_eps; }, true},
    {"lora-r", "lora_r", "R",
     "train LoRA adapters of rank R over a frozen base (no gradients or moments for the base; saved as a PEFT "
     "adapter directory); 0 = train every weight",
     0, 65536, true, [](TrainSettings& s) -> TrainOptionField { return &s.lora_r; }, true},
    {"lora-alpha", "lora_alpha", "X", "LoRA scaling numerator: adapters scaled by alpha/r", 1e-12, kBig, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.lora_alpha; }, true},
    {"lora-targets", "lora_targets", "LIST",
     "comma-separated modules to adapt, PEFT's target_modules (GPT-2: c_attn, attn.c_proj, c_fc, mlp.c_proj, "
     "c_proj; Llama: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj); empty: PEFT's default "
     "(GPT-2 c_attn, Llama q_proj,v_proj)",
     0, 0, true, [](TrainSettings& s) -> TrainOptionField { return &s.lora_targets; }, true},
    {"lora-rslora", "lora_rslora", "", "rank-stabilised LoRA: scale by alpha/sqrt(r)", 0, 0, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.lora_rslora; }, true},
    {"lora-dropout", "lora_dropout", "X",
     "dropout probability on each adapter's input in training steps (PEFT's lora_dropout)", 0, 0.999, true,
     [](TrainSettings& s) -> TrainOptionField { return &s.lora_dropout; }, true},
    {"row-chunk", "row_chunk", "N",
     "rows of a step's B*T that each block computes at once: larger runs larger matrix products (they fill a GPU "
     "better) in more workspace memory, smaller needs less; where B*T exceeds it the weight gradients are summed "
     "chunk by chunk, so another value gives other roundings (every budget and placement the same bits); 0: 1024 "
     "on the CPU, 4096 with --backend cuda",
     0, kMaxRowChunk, true, [](TrainSettings& s) -> TrainOptionField { return &s.row_chunk; }, true},
    // Where the run computes and keeps its state (recorded, so a resume that leaves them out
    // continues as the run was; Note [option table]).
    {"threads", "threads", "N",
     "compute threads; 0: STRATUM_THREADS or all CPUs (the CPU's matrix products' bits depend on the count, so a "
     "resume takes the checkpoint's unless given)",
     0, 1024, false, [](TrainSettings& s) -> TrainOptionField { return &s.threads; }, true},
    {"activations", "activations", "MODE",
     "auto: the plan chooses under --mem-budget, else recompute | recompute (keep block inputs only) | offload "
     "(block internals to the offload dir, read back in the backward) | keep (every block's internals in RAM); same "
     "bits",
     0, 0, false, [](TrainSettings& s) -> TrainOptionField { return &s.activations; }, true},
    {"mem-budget", "mem_budget", "SIZE",
     "bound all engine memory (params, grads, moments, activations) to SIZE, e.g. 512M or 4G; what does not fit is "
     "streamed from --offload-dir (default: all in RAM; 0 drops a resumed checkpoint's budget)",
     0, 1e18, false, [](TrainSettings& s) -> TrainOptionField { return &s.mem_budget_bytes; }, true, true},
    {"offload-dir", "offload_dir", "DIR", "directory on a fast disk (NVMe) for state that does not fit --mem-budget",
     0, 0, false, [](TrainSettings& s) -> TrainOptionField { return &s.offload_dir; }, true},
    {"log", "log_path", "FILE.jsonl",
     "write one JSON object per step (a resume continues the run's log unless given another; a fork into another --save does not)", 0, 0, false,
     [](TrainSettings& s) -> TrainOptionField { return &s.log_path; }, true},
    {"prefetch", "prefetch", "K",
     "with --mem-budget: schedule groups loaded ahead of the one computing (-1: the plan's choice, see stratum "
     "plan); with --gpu-mem-budget: copied to the GPU ahead (-1: 2)",
     -1, 64, false, [](TrainSettings& s) -> TrainOptionField { return &s.prefetch; }, true},
    {"io", "io", "BACKEND", "with --mem-budget: auto (io_uring, else threads) | uring | threads", 0, 0, false,
     [](TrainSettings& s) -> TrainOptionField { return &s.io_backend; }, true},
    {"io-block", "io_block", "SIZE", "with --mem-budget: I/O block size, a multiple of 4K (see bench/io_sweep)", 4096,
     1 << 30, false, [](TrainSettings& s) -> TrainOptionField { return &s.io_block_bytes; }, true, true},
    {"io-depth", "io_depth", "N", "with --mem-budget: I/O blocks in flight", 1, 1024, false,
     [](TrainSettings& s) -> TrainOptionField { return &s.io_queue_depth; }, true},
    {"backend", "backend", "NAME",
     "cpu | cuda: the whole step on the GPU; the parameters, gradients, moments and activations it uses in GPU "
     "memory (all of them unless --gpu-mem-budget); the GPU's bits differ from the CPU's",
     0, 0, false, [](TrainSettings& s) -> TrainOptionField { return &s.backend; }, true},
    {"gpu-mem-budget", "gpu_mem_budget", "SIZE",
     "with --backend cuda: bound the GPU memory the engine uses to SIZE, e.g. 6G; what does not fit stays in RAM "
     "(or under --mem-budget on --offload-dir) and is copied in when used (default: the whole state on the GPU)",
     0, 1e18, false, [](TrainSettings& s) -> TrainOptionField { return &s.gpu_mem_budget_bytes; }, true, true},
    {"adamw-on", "adamw_on", "WHERE",
     "with --backend cuda: auto: the CPU, beside the GPU's compute, when the state does not fit --gpu-mem-budget; "
     "else the GPU | gpu | cpu (ZeRO-Offload: the AdamW moments stay in RAM, gradients come down, parameters go "
     "up); same bits",
     0, 0, false, [](TrainSettings& s) -> TrainOptionField { return &s.adamw_on; }, true},
};
}  // namespace

std::span<const TrainOption> train_option_table() { return kTable; }

Precision precision_parse(const std::string& name) {
  if (name == "fp32") return Precision::Fp32;
  if (name == "bf16") return Precision::Bf16;
  STRATUM_FAIL("[train] --precision must be 'fp32' or 'bf16', got '", name, "'");
}

AdamWOn adamw_on_parse(const std::string& name) {
  if (name == "auto") return AdamWOn::Auto;
  if (name == "gpu") return AdamWOn::Device;
  if (name == "cpu") return AdamWOn::Host;
  STRATUM_FAIL("[train] --adamw-on must be 'auto', 'gpu' or 'cpu', got '", name, "'");
}

int row_chunk_default(Backend backend) { return backend == Backend::Cpu ? kRowChunk : kRowChunkDevice; }

const char* train_optimizer_name(TrainOptimizer o) { return o == TrainOptimizer::ZoSgd ? "zo-sgd" : "adamw"; }

TrainOptimizer train_optimizer_parse(const std::string& name) {
  if (name == "adamw") return TrainOptimizer::AdamW;
  if (name == "zo-sgd") return TrainOptimizer::ZoSgd;
  STRATUM_FAIL("[train] --optimizer must be 'adamw' or 'zo-sgd', got '", name, "'");
}

const char* train_option_enum_name(LrScheduleKind v) { return lr_kind_name(v); }
const char* train_option_enum_name(Precision v) { return precision_name(v); }
const char* train_option_enum_name(TrainOptimizer v) { return train_optimizer_name(v); }
const char* train_option_enum_name(ActivationPolicy v) { return activation_policy_name(v); }
const char* train_option_enum_name(IoBackend v) { return io_backend_name(v); }
const char* train_option_enum_name(Backend v) { return backend_name(v); }
const char* train_option_enum_name(AdamWOn v) {
  return v == AdamWOn::Device ? "gpu" : v == AdamWOn::Host ? "cpu" : "auto";
}
void train_option_enum_parse(const std::string& name, LrScheduleKind& v) { v = lr_schedule_parse(name); }
void train_option_enum_parse(const std::string& name, Precision& v) { v = precision_parse(name); }
void train_option_enum_parse(const std::string& name, TrainOptimizer& v) { v = train_optimizer_parse(name); }
void train_option_enum_parse(const std::string& name, ActivationPolicy& v) { v = activation_policy_parse(name); }
void train_option_enum_parse(const std::string& name, IoBackend& v) { v = io_backend_parse(name); }
void train_option_enum_parse(const std::string& name, Backend& v) { v = backend_parse(name); }
void train_option_enum_parse(const std::string& name, AdamWOn& v) { v = adamw_on_parse(name); }

std::string train_option_size_text(std::uint64_t bytes) {
  if (bytes == 0) return "";
  for (const auto& [unit, shift] : {std::pair{'T', 40}, std::pair{'G', 30}, std::pair{'M', 20}, std::pair{'K', 10}})
    if (bytes % (std::uint64_t{1} << shift) == 0) return std::to_string(bytes >> shift) + unit;
  return std::to_string(bytes);
}

namespace {
std::int64_t int64_saturated(double v) {
  constexpr double kTwo63 = 9223372036854775808.0;  // 2^63, the first double beyond int64
  if (v >= kTwo63) return std::numeric_limits<std::int64_t>::max();
  if (v <= -kTwo63) return std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(v);
}
}  // namespace

std::int64_t train_option_int_min(const TrainOption& option) { return int64_saturated(option.min); }
std::int64_t train_option_int_max(const TrainOption& option) { return int64_saturated(option.max); }

std::string train_option_text(const TrainOption& option, const TrainSettings& s) {
  return std::visit(
      [&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) return *p;
        else if constexpr (std::is_same_v<T, bool>) return *p ? "on" : "off";
        else if constexpr (std::is_enum_v<T>) return train_option_enum_name(*p);
        else if constexpr (std::is_same_v<T, double>) return number_text(*p);
        else if constexpr (std::is_same_v<T, std::uint64_t>) return option.bytes ? train_option_size_text(*p) : std::to_string(*p);
        else return std::to_string(*p);
      },
      field_of(option, s));
}

bool train_option_equal(const TrainOption& option, const TrainSettings& a, const TrainSettings& b) {
  return std::visit(
      [&](auto* pa) {
        using P = decltype(pa);
        return *pa == *std::get<P>(field_of(option, b));
      },
      field_of(option, a));
}

void train_option_copy(const TrainOption& option, const TrainSettings& from, TrainSettings& to) {
  std::visit(
      [&](auto* dst) {
        using P = decltype(dst);
        *dst = *std::get<P>(field_of(option, from));
      },
      option.field(to));
}

nlohmann::json train_option_json(const TrainOption& option, const TrainSettings& s) {
  return std::visit(
      [&](auto* p) -> nlohmann::json {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::uint64_t>) {  // 64 bits do not survive a JSON double
          if (option.bytes) return *p;                      // sizes stay below 2^53
          return hash_text(*p);
        } else if constexpr (std::is_enum_v<T>) {
          return train_option_enum_name(*p);
        } else {
          return *p;
        }
      },
      field_of(option, s));
}

void train_option_read(const TrainOption& option, const JsonFields& f, TrainSettings& s) {
  const char* key = option.key;
  if (option.later && !f.has(key)) return;  // written before the option existed: the default
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *p = f.str(key);
          f.check(option.min < 1 || !p->empty(), key, "is empty");
        } else if constexpr (std::is_same_v<T, bool>) {
          *p = f.boolean(key);
        } else if constexpr (std::is_same_v<T, std::uint64_t>) {
          if (option.bytes)
            *p = static_cast<T>(f.integer(key, train_option_int_min(option), train_option_int_max(option)));
          else
            *p = f.hex(key);
        } else if constexpr (std::is_enum_v<T>) {
          // Precision and the optimizer predate `later`: a trainer state without them had the defaults.
          const std::string name = f.str_or(key, train_option_enum_name(*p));
          bool known = false;
          try {
            train_option_enum_parse(name, *p);
            known = true;
          } catch (const Error&) {
          }
          f.check(known, key, (std::string("is not a value --") + option.flag + " takes").c_str());
        } else if constexpr (std::is_same_v<T, double>) {
          *p = f.number(key, option.min, option.max);
        } else {
          *p = static_cast<T>(f.integer(key, train_option_int_min(option), train_option_int_max(option)));
        }
      },
      option.field(s));
}

}  // namespace stratum
