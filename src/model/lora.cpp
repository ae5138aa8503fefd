// LoRA adapters: targets and the adapter products; see lora.h and Note [lora math].
#include "model/lora.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "stratum/error.h"

namespace stratum {

float LoraConfig::scale() const {
  return static_cast<float>(rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / r);
}

LoraFamily lora_family(const GptConfig& cfg) {
  return cfg.fused_projections() ? LoraFamily::Phi3 : cfg.llama() ? LoraFamily::Llama : LoraFamily::Gpt2;
}

const std::vector<std::string>& lora_modules(LoraFamily family) {
  static const std::vector<std::string> gpt2 = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  static const std::vector<std::string> llama = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                 "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                 "mlp.down_proj"};
  static const std::vector<std::string> phi3 = {"self_attn.qkv_proj", "self_attn.qkv_proj", "self_attn.qkv_proj",
                                                "self_attn.o_proj",   "mlp.gate_up_proj",   "mlp.gate_up_proj",
                                                "mlp.down_proj"};
  return family == LoraFamily::Phi3 ? phi3 : family == LoraFamily::Llama ? llama : gpt2;
}

bool lora_module_in_mlp(LoraFamily family, int k) {
  return lora_modules(family)[static_cast<std::size_t>(k)].rfind("mlp.", 0) == 0;
}

std::array<int, 2> lora_module_dims(const GptConfig& cfg, int k) {
  const int C = cfg.n_embd, I = cfg.mlp_width();
  if (!cfg.llama()) {
    const std::array<int, 2> dims[] = {{C, 3 * C}, {C, C}, {C, I}, {I, C}};
    return dims[k];
  }
  const int Q = cfg.q_dim(), KV = cfg.kv_dim();
  const std::array<int, 2> dims[] = {{C, Q}, {C, KV}, {C, KV}, {Q, C}, {C, I}, {C, I}, {I, C}};
  return dims[k];
}

namespace {
bool lora_key_matches(const std::string& module, const std::string& key) {
  return module == key || (module.size() > key.size() &&
                           module.compare(module.size() - key.size(), key.size(), key) == 0 &&
                           module[module.size() - key.size() - 1] == '.');
}
}  // namespace

bool lora_target_known(LoraFamily family, const std::string& key) {
  for (const std::string& m : lora_modules(family))
    if (lora_key_matches(m, key)) return true;
  return false;
}

std::array<bool, kLoraMaxTargets> lora_targets_resolve(LoraFamily family, const std::vector<std::string>& targets) {
  const std::vector<std::string>& modules = lora_modules(family);
  const char* family_name = family == LoraFamily::Phi3 ? "phi3" : family == LoraFamily::Llama ? "llama" : "gpt2";
  std::string valid;
  for (std::size_t k = 0; k < modules.size(); ++k) {
    const std::string& m = modules[k];
    if (k > 0 && m == modules[k - 1]) continue;  // a fused module's later part (Note [fused lora])
    valid += (valid.empty() ? "" : ", ") + m;
    const std::size_t dot = m.find('.');
    valid += " (" + m.substr(dot + 1) + ")";
  }
  STRATUM_CHECK(!targets.empty(), "[lora] no target modules: name them with --lora-targets (for a ", family_name,
                " model: ", valid, ")");
  std::array<bool, kLoraMaxTargets> on{};
  for (const std::string& key : targets) {
    bool matched = false;
    for (std::size_t k = 0; k < modules.size(); ++k)
      if (lora_key_matches(modules[k], key)) on[k] = matched = true;
    STRATUM_CHECK(matched, "[lora] target module '", key, "' is not a linear layer of a ", family_name,
                  " block; valid: ", valid);
  }
  return on;
}

LoraConfig lora_config_make(LoraFamily family, int r, double alpha, const std::string& targets_csv, bool rslora,
                            double dropout) {
  LoraConfig lora;
  lora.r = r;
  lora.alpha = alpha;
  lora.rslora = rslora;
  lora.dropout = dropout;
  if (r == 0) return lora;
  std::size_t at = 0;
  while (at <= targets_csv.size() && !targets_csv.empty()) {
    const std::size_t comma = std::min(targets_csv.find(',', at), targets_csv.size());
    const std::string key = targets_csv.substr(at, comma - at);
    STRATUM_CHECK(!key.empty(), "[lora] --lora-targets '", targets_csv, "' has an empty name; e.g. q_proj,v_proj");
    // A name given twice is one target (PEFT keeps target_modules as a set): written once.
    if (std::find(lora.targets.begin(), lora.targets.end(), key) == lora.targets.end()) lora.targets.push_back(key);
    at = comma + 1;
  }
  if (lora.targets.empty())  // PEFT's default target_modules for the family
    lora.targets = family == LoraFamily::Phi3
                       ? std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
                   : family == LoraFamily::Llama ? std::vector<std::string>{"q_proj", "v_proj"}
                                                 : std::vector<std::string>{"c_attn"};
  lora_config_validate(lora, family);
  return lora;
}

std::string lora_targets_text(const LoraConfig& lora) {
  std::string out;
  for (const std::string& t : lora.targets) out += (out.empty() ? "" : ",") + t;
  return out;
}

std::array<bool, kLoraMaxTargets> lora_config_validate(const LoraConfig& lora, LoraFamily family) {
  STRATUM_CHECK(lora.r > 0, "[lora] rank r must be positive, got ", lora.r, " (e.g. --lora-r 16)");
  STRATUM_CHECK(lora.alpha > 0 && std::isfinite(lora.alpha), "[lora] lora_alpha must be positive, got ", lora.alpha,
                " (e.g. --lora-alpha 32)");
  STRATUM_CHECK(lora.dropout >= 0 && lora.dropout < 1, "[lora] lora_dropout must be in [0, 1), got ", lora.dropout,
                " (e.g. --lora-dropout 0.05)");
  return lora_targets_resolve(family, lora.targets);
}

void lora_forward_u(const Ops& ops, const LoraBlock& lora, int k, const float* x, int ldx, int M, int in) {
  const LoraBlock::Target& t = lora.t[k];
  if (t.a == nullptr) return;
  if (lora.dropout > 0) {  // x -> dropout(x) (Note [lora dropout])
    ops.dropout(lora.xd, in, x, ldx, M, in, t.drop_key, lora.dropout, false);
    x = lora.xd;
    ldx = in;
  }
  ops.sgemm(false, true, M, lora.r, in, 1.0f, x, ldx, t.a, in, 0.0f, t.u, lora.r);  // u = x A^T
}

void lora_forward(const Ops& ops, const LoraBlock& lora, int k, float* y, int ldy, const float* x, int ldx, int M,
                  int in, int out) {
  const LoraBlock::Target& t = lora.t[k];
  if (t.a == nullptr) return;
  lora_forward_u(ops, lora, k, x, ldx, M, in);
  ops.sgemm(false, true, M, out, lora.r, lora.scale, t.u, lora.r, t.b, lora.r, 1.0f, y, ldy);  // y += s u B^T
}

LoraBlock lora_rows(const LoraBlock& lora, int k, int r0, int in) {
  LoraBlock rows = lora;
  LoraBlock::Target& t = rows.t[k];
  if (t.a == nullptr || r0 == 0) return rows;
  t.u += static_cast<std::size_t>(r0) * lora.r;
  // Element i of the rows' (M, in) input is element r0 * in + i of the pass's: the key moves by
  // r0 * in steps of the mask's counter (Note [dropout mask] in core/dropout_mask.h).
  t.drop_key += static_cast<std::uint64_t>(r0) * static_cast<std::uint64_t>(in) * kSplitMix64Gamma;
  return rows;
}

void lora_backward(const Ops& ops, const LoraBlock& lora, int k, const float* dy, int ldy, const float* x, int ldx,
                   float* dx, int lddx, int M, int in, int out, bool accumulate) {
  const LoraBlock::Target& t = lora.t[k];
  if (t.a == nullptr) return;
  const int r = lora.r;
  const bool drop = lora.dropout > 0;
  if (drop) {  // the forward's dropped input, regenerated (Note [lora dropout])
    ops.dropout(lora.xd, in, x, ldx, M, in, t.drop_key, lora.dropout, false);
    x = lora.xd;
    ldx = in;
  }
  const float beta = accumulate ? 1.0f : 0.0f;
  const float beta_a = accumulate || t.da_adds ? 1.0f : 0.0f;  // Note [fused lora]
  ops.sgemm(true, false, out, r, M, lora.scale, dy, ldy, t.u, r, beta, t.db, r);      // dB (+)= s dy^T u
  ops.sgemm(false, false, M, r, out, lora.scale, dy, ldy, t.b, r, 0.0f, lora.du, r);  // du = s dy B
  ops.sgemm(true, false, r, in, M, 1.0f, lora.du, r, x, ldx, beta_a, t.da, in);       // dA (+)= du^T x
  if (!drop) {
    ops.sgemm(false, false, M, in, r, 1.0f, lora.du, r, t.a, in, 1.0f, dx, lddx);     // dx += du A
    return;
  }
  ops.sgemm(false, false, M, in, r, 1.0f, lora.du, r, t.a, in, 0.0f, lora.xd, in);    // d xd = du A
  ops.dropout(dx, lddx, lora.xd, in, M, in, t.drop_key, lora.dropout, true);         // dx += dropout(d xd)
}

void lora_merge(const Ops& ops, const LoraBlock& lora, int k, float* w, bool fan_in_fan_out, int in, int out) {
  const LoraBlock::Target& t = lora.t[k];
  if (t.a == nullptr) return;
  const int r = lora.r;
  if (fan_in_fan_out)
    ops.sgemm(true, true, in, out, r, lora.scale, t.a, in, t.b, r, 1.0f, w, out);  // w (in,out) += s A^T B^T
  else
    ops.sgemm(false, false, out, in, r, lora.scale, t.b, r, t.a, in, 1.0f, w, in);  // w (out,in) += s B A
}

}  // namespace stratum
