// Loading, saving and initialising GPT-2 and Llama weights; see model_io.h.
#include "weights/model_io.h"
#include "weights/tensor_io.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <memory>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/file_util.h"
#include "core/hash.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/hf_config.h"
#include "formats/safetensors.h"
#include "stratum/error.h"

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace stratum {

GptConfig model_read_config(const std::string& dir) {
  STRATUM_CHECK(dir_exists(dir), "[model] model directory '", dir, "' ",
                file_exists(dir) ? "is a file: give the directory that holds config.json and model.safetensors"
                                 : "does not exist");
  const std::string path = dir + "/config.json";
  STRATUM_CHECK(file_exists(path), "[model] '", dir,
                "' has no config.json: expected a Hugging Face model directory (GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3 or Gemma)");
  return hf_config_read(path);
}

namespace {
std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

bool ignorable_tensor(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const std::size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  // GPT-2's causal-mask buffers, Llama's saved rotary frequencies (older transformers), a tied
  // model's copy of the LM head (an untied one has it in the layout), and a multimodal Gemma 3's
  // vision tower and projector (Note [gemma3 multimodal]: Stratum runs its text model).
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || ends_with(".rotary_emb.inv_freq") ||
         name == "lm_head.weight" || name.starts_with("vision_tower.") || name.starts_with("multi_modal_projector.") ||
         name.starts_with("model.vision_tower.") || name.starts_with("model.multi_modal_projector.");
}
}  // namespace

bool segment_selected(const ParamLayout& layout, int s, SegmentSelect select) {
  switch (select) {
    case SegmentSelect::All: return true;
    case SegmentSelect::Base: return layout.segments()[s].role != SegmentRole::Lora;
    case SegmentSelect::Adapters: return layout.segments()[s].role == SegmentRole::Lora;
    case SegmentSelect::Trainable: return layout.trainable(s);
  }
  return false;
}

void load_kinds(const std::vector<std::string>& paths, const ParamLayout& layout, SegmentStore* store,
                const std::vector<std::pair<SegmentKind, std::string>>& kinds,
                const std::function<bool(const std::string&)>& ignore, const char* what,
                const std::map<std::string, std::string>* expect, SegmentSelect select, const std::string& prefix,
                const std::function<bool(int)>* keep) {
  std::vector<std::vector<std::vector<bool>>> seen(kinds.size(), std::vector<std::vector<bool>>(layout.segment_count()));
  for (auto& per_kind : seen)
    for (int s = 0; s < layout.segment_count(); ++s)
      per_kind[s].assign(segment_selected(layout, s, select) ? layout.segments()[s].tensors.size() : 0, false);
  const std::string family = layout.family_title();
  const bool adapters = select == SegmentSelect::Adapters;
  for (const std::string& path : paths) {
  SafetensorsFile file = SafetensorsFile::open(path);
  const std::string base = std::filesystem::path(path).filename().string();
  if (expect != nullptr)  // every tensor the index places in this shard is there
    for (const auto& [name, shard] : *expect)
      STRATUM_CHECK(shard != base || file.find(name) != nullptr, "[model] ", path, ": tensor '", name,
                    "' is named by model.safetensors.index.json but absent from this shard");
  for (const auto& info : file.tensors()) {
    if (expect != nullptr) {
      const auto it = expect->find(info.name);
      STRATUM_CHECK(it == expect->end() || it->second == base, "[model] ", path, ": holds tensor '", info.name,
                    "', but the index places it in '", it == expect->end() ? "" : it->second, "'");
    }
    std::size_t k = 0;
    std::vector<std::pair<int, int>> slots;
    const bool prefixed = info.name.compare(0, prefix.size(), prefix) == 0;
    for (; k < kinds.size() && prefixed; ++k) {
      const std::string& suffix = kinds[k].second;
      if (info.name.size() < prefix.size() + suffix.size() ||
          info.name.compare(info.name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      slots = layout.find(info.name.substr(prefix.size(), info.name.size() - suffix.size() - prefix.size()));
      std::erase_if(slots, [&](const std::pair<int, int>& st) { return !segment_selected(layout, st.first, select); });
      if (!slots.empty()) break;
    }
    if (slots.empty()) {
      if (ignore(info.name)) continue;
      STRATUM_FAIL("[model] ", path, ": unexpected tensor '", info.name, "' (not part of ", what, " for a ", family,
                   " model with this config.json", adapters ? "; was the adapter made for another base model?)" : ")");
    }
    const TensorSlot& first = layout.segments()[slots[0].first].tensors[slots[0].second];
    STRATUM_CHECK(info.shape == first.hf_shape, "[model] ", path, ": tensor '", info.name, "' has shape ",
                  shape_text(info.shape), ", but ",
                  adapters ? "the base model's config.json with adapter_config.json's r" : "config.json", " implies ",
                  shape_text(first.hf_shape), adapters ? ": was the adapter made for another base model?" : "");
    for (const auto& [s, t] : slots) {
      const TensorSlot& slot = layout.segments()[s].tensors[t];
      STRATUM_CHECK(!seen[k][s][t], "[model] ", path, ": tensor '", info.name,
                    "' appears twice (with and without prefix)");
      if (store == nullptr || (keep != nullptr && !(*keep)(s))) {  // present and shaped right; not held here
        STRATUM_CHECK(info.dtype == DType::F32 || info.dtype == DType::F16 || info.dtype == DType::BF16 ||
                          info.dtype == DType::F64,
                      "[model] ", path, ": tensor '", info.name, "' has dtype ", dtype_name(info.dtype),
                      "; expected a floating-point tensor (F32, F16, BF16 or F64)");
        seen[k][s][t] = true;
        continue;
      }
      // A slot may hold rows [row0, row0 + rows) of the tensor (Note [vocab blocks]).
      SegmentHold hold(*store, s, kinds[k].first, Access::Update, slot.chunk);
      const std::size_t at = layout.segments()[s].offset_in_chunk(slot);
      std::size_t bad = slot.numel;  // the first non-finite element, if any
      float bad_value = 0.0f;
      if (store->units().dtype(store->units().index(s, kinds[k].first, slot.chunk)) == DType::BF16) {  // Note [bf16 weights]
        std::uint16_t* const dst = hold.view().bf16() + at;
        if (info.dtype == DType::BF16) {
          file.read_raw_range(info, slot.hf_first(), slot.numel, dst);
        } else {  // rounded to bf16 (generate --precision bf16), through a bounded staging buffer
          constexpr std::size_t kStage = std::size_t{1} << 18;
          std::vector<float> stage(std::min(kStage, slot.numel));
          for (std::size_t i = 0; i < slot.numel; i += stage.size()) {
            const std::size_t n = std::min(stage.size(), slot.numel - i);
            file.read_f32_range(info, slot.hf_first() + i, n, stage.data());
            for (std::size_t j = 0; j < n; ++j) dst[i + j] = f32_to_bf16(stage[j]);
          }
        }
        for (std::size_t i = 0; i < slot.numel && bad == slot.numel; ++i)
          if ((dst[i] & 0x7f80u) == 0x7f80u) bad = i, bad_value = bf16_to_f32(dst[i]);
      } else {
        float* const dst = hold.data() + at;
        file.read_f32_range(info, slot.hf_first(), slot.numel, dst);
        for (std::size_t i = 0; i < slot.numel && bad == slot.numel; ++i)
          if (!std::isfinite(dst[i])) bad = i, bad_value = dst[i];
      }
      // A NaN or infinity is never a weight or moment a model can run with: a corrupt file or a
      // diverged run (Note [checked reads]).
      STRATUM_CHECK(bad == slot.numel, "[model] ", path, ": tensor '", info.name, "' holds ", bad_value,
                    " at element ", slot.hf_first() + bad, " (corrupt, or saved from a run that diverged)");
      seen[k][s][t] = true;
    }
  }
  }
  const std::string where = paths.size() == 1 ? paths[0] : std::filesystem::path(paths[0]).parent_path().string();
  for (std::size_t k = 0; k < kinds.size(); ++k)
    for (int s = 0; s < layout.segment_count(); ++s)
      for (std::size_t t = 0; t < seen[k][s].size(); ++t)
        STRATUM_CHECK(seen[k][s][t], "[model] ", where, ": tensor '", prefix,
                      layout.hf_name(layout.segments()[s].tensors[t]), kinds[k].second, "' is missing");
}

void write_kinds(const std::string& path, const ParamLayout& layout, SegmentStore& store,
                 const std::vector<std::pair<SegmentKind, std::string>>& kinds,
                 const std::map<std::string, std::string>& metadata, SegmentSelect select, const std::string& prefix,
                 DType out, const std::function<bool(int)>* keep) {
  STRATUM_ASSERT(out == DType::F32 || out == DType::BF16);
  std::unique_ptr<SegmentHold> hold;
  std::vector<std::uint16_t> rounded;  // the current BF16 piece (valid until the next data_fn call)
  struct Held {
    int segment = -1, chunk = -1;
    SegmentKind kind = SegmentKind::Params;
    bool operator==(const Held&) const = default;
  } held;
  std::vector<SafetensorsWriteEntry> entries;
  std::vector<int> order;
  for (int k = 0; k < layout.vocab_block_count(); ++k) order.push_back(layout.vocab_segment(k));
  for (int s = 0; s < layout.segment_count(); ++s)
    if (layout.segments()[s].role != SegmentRole::Vocab) order.push_back(s);
  std::erase_if(order, [&](int s) { return !segment_selected(layout, s, select) || (keep != nullptr && !(*keep)(s)); });
  for (const auto& [kind, suffix] : kinds) {
    for (int s : order) {
      for (const auto& t : layout.segments()[s].tensors) {
        if (t.row0 != 0) continue;  // written as a piece of the entry of its first slot
        SafetensorsWriteEntry e{prefix + layout.hf_name(t) + suffix, out, t.hf_shape, nullptr, {}, {}};
        struct Piece {
          int segment, chunk;
          std::size_t offset;  // in the chunk
          std::size_t numel;
        };
        std::vector<Piece> pieces;
        for (const auto& [ps, pt] : layout.find(t.name)) {
          STRATUM_ASSERT(keep == nullptr || (*keep)(ps));  // a tensor is written whole
          const TensorSlot& slot = layout.segments()[ps].tensors[pt];
          pieces.push_back({ps, slot.chunk, layout.segments()[ps].offset_in_chunk(slot), slot.numel});
          e.piece_bytes.push_back(slot.numel * dtype_size_bytes(out));
        }
        e.data_fn = [&, pieces, kind = kind, name = e.name](std::size_t piece) -> const void* {
          const Piece& p = pieces[piece];
          const Held want{p.segment, p.chunk, kind};
          if (!(held == want)) {
            hold.reset();
            hold = std::make_unique<SegmentHold>(store, p.segment, kind, Access::Read, p.chunk);
            held = want;
          }
          const TensorView v = hold->view().slice(p.offset, p.numel);
          // Note [checked reads] refuses a NaN or infinity on load, so none is written: a run whose
          // last update diverged (its loss was still finite) saved a checkpoint nothing could load.
          bool finite = true;  // an all-ones exponent, tested branch-free (vectorised: saves stay I/O-bound)
          if (v.dtype() == DType::F32) {
            const auto* bits = reinterpret_cast<const std::uint32_t*>(v.f32());
            for (std::size_t i = 0; i < p.numel; ++i) finite &= (bits[i] & 0x7f800000u) != 0x7f800000u;
          } else {
            const std::uint16_t* bits = v.bf16();
            for (std::size_t i = 0; i < p.numel; ++i) finite &= (bits[i] & 0x7f80u) != 0x7f80u;
          }
          STRATUM_CHECK(finite, "[model.save] tensor '", name, "' holds a NaN or infinity: training diverged "
                        "(lower --lr or --weight-decay, or clip with --grad-clip)");
          if (v.dtype() == out) return v.data();
          rounded.resize(p.numel);
          if (v.dtype() == DType::F32) {
            for (std::size_t i = 0; i < p.numel; ++i) rounded[i] = f32_to_bf16(v.f32()[i]);
            for (std::size_t i = 0; i < p.numel; ++i) finite &= (rounded[i] & 0x7f80u) != 0x7f80u;
            STRATUM_CHECK(finite, "[model.save] tensor '", name, "' holds a value beyond bfloat16's range (about "
                          "3.4e38), which rounds to infinity: write it as F32");
            return rounded.data();
          }
          STRATUM_FAIL("[model.save] cannot write bf16 units as F32");  // no caller asks for it
        };
        entries.push_back(std::move(e));
      }
    }
  }
  safetensors_write(path, entries, metadata);
}

namespace {
std::string single_weights_file(const std::string& dir) { return dir + "/model.safetensors"; }
std::string weights_index_file(const std::string& dir) { return dir + "/model.safetensors.index.json"; }
}  // namespace

std::vector<std::string> model_weight_files(const std::string& dir, std::map<std::string, std::string>* weight_map) {
  const std::string single = single_weights_file(dir);
  if (file_exists(single)) return {single};
  const std::string index_path = weights_index_file(dir);
  STRATUM_CHECK(file_exists(index_path), "[model] '", dir,
                "' has no model.safetensors (nor model.safetensors.index.json for a sharded model)");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(file_read_all(index_path));
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL("[model] ", index_path, ": not valid JSON (", e.what(), ")");
  }
  STRATUM_CHECK(index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(), "[model] ",
                index_path, ": expected an object with a 'weight_map' object (tensor name -> shard file)");
  std::set<std::string> files;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    STRATUM_CHECK(file.is_string() && !file.get<std::string>().empty() &&
                      file.get<std::string>().find('/') == std::string::npos && file.get<std::string>() != "..",
                  "[model] ", index_path, ": weight_map['", name, "'] must be a file name in the model directory");
    files.insert(file.get<std::string>());
    if (weight_map != nullptr) (*weight_map)[name] = file.get<std::string>();
  }
  STRATUM_CHECK(!files.empty(), "[model] ", index_path, ": weight_map is empty");
  std::vector<std::string> paths;
  for (const std::string& file : files) {
    const std::string path = dir + "/" + file;
    STRATUM_CHECK(file_exists(path), "[model] '", dir, "': shard '", file, "' named by model.safetensors.index.json is missing");
    paths.push_back(path);
  }
  return paths;
}

bool model_weights_bf16(const std::string& dir) {
  if (!file_exists(single_weights_file(dir)) && !file_exists(weights_index_file(dir))) return false;  // none
  for (const std::string& path : model_weight_files(dir, nullptr)) {
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const auto& info : file.tensors())
      if (info.dtype != DType::BF16 && !ignorable_tensor(info.name)) return false;
  }
  return true;
}

void model_load_weights(const std::string& dir, const ParamLayout& layout, SegmentStore& store) {
  std::map<std::string, std::string> weight_map;
  const std::vector<std::string> paths = model_weight_files(dir, &weight_map);
  load_kinds(paths, layout, &store, {{SegmentKind::Params, ""}}, ignorable_tensor, "the weights",
             weight_map.empty() ? nullptr : &weight_map, SegmentSelect::Base);
}

void model_check_weights(const std::string& dir, const ParamLayout& layout) {
  std::map<std::string, std::string> weight_map;
  const std::vector<std::string> paths = model_weight_files(dir, &weight_map);
  load_kinds(paths, layout, nullptr, {{SegmentKind::Params, ""}}, ignorable_tensor, "the weights",
             weight_map.empty() ? nullptr : &weight_map, SegmentSelect::Base);
}

std::string optimizer_shard_name(int shard, int shards) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer-%05d-of-%05d.safetensors", shard + 1, shards);
  return name;
}

bool optimizer_shard_parse(const std::string& name, int* shard, int* shards) {
  int i = 0, n = 0, used = 0;
  if (std::sscanf(name.c_str(), "optimizer-%5d-of-%5d.safetensors%n", &i, &n, &used) != 2 ||
      static_cast<std::size_t>(used) != name.size() || n < 1 || i < 1 || i > n || name != optimizer_shard_name(i - 1, n))
    return false;
  *shard = i - 1;
  *shards = n;
  return true;
}

std::vector<std::string> optimizer_files(const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), "optimizer.safetensors") != names.end()) return {"optimizer.safetensors"};
  int count = 0;
  std::vector<std::string> shards;
  for (const std::string& name : names) {
    int i = 0, n = 0;
    if (!optimizer_shard_parse(name, &i, &n)) continue;
    if (shards.empty()) shards.assign(static_cast<std::size_t>(n), "");
    if (n != static_cast<int>(shards.size()) || !shards[static_cast<std::size_t>(i)].empty()) return {};
    shards[static_cast<std::size_t>(i)] = name;
    ++count;
  }
  if (count == 0 || count != static_cast<int>(shards.size())) return {};
  return shards;
}

void optimizer_load(const std::string& dir, const ParamLayout& layout, SegmentStore& store,
                    const std::function<bool(int)>* keep) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) names.push_back(entry.path().filename().string());
  std::vector<std::string> paths = optimizer_files(names);
  STRATUM_CHECK(!paths.empty(), "[checkpoint] '", dir,
                "' has no optimizer.safetensors and no complete set of optimizer-NNNNN-of-NNNNN.safetensors shards");
  for (std::string& p : paths) p = dir + "/" + p;
  load_kinds(paths, layout, &store, {{SegmentKind::AdamM, ".exp_avg"}, {SegmentKind::AdamV, ".exp_avg_sq"}},
             [](const std::string&) { return false; }, "the AdamW state", nullptr, SegmentSelect::Trainable, "", keep);
}

void optimizer_write_file(const std::string& path, const ParamLayout& layout, SegmentStore& store,
                          const std::function<bool(int)>* keep) {
  write_kinds(path, layout, store, {{SegmentKind::AdamM, ".exp_avg"}, {SegmentKind::AdamV, ".exp_avg_sq"}},
              {{"format", "pt"}, {"stratum", "adamw_moments"}}, SegmentSelect::Trainable, "", DType::F32, keep);
}

namespace {
// Tensor t of a held params segment: its values written (fp32, or rounded to a bf16 unit's bf16),
// and read as fp32 (in place, or a bf16 unit's widened exactly into scratch).
void tensor_put(const SegmentChunksHold& params, const TensorSlot& t, const std::vector<float>& v) {
  const TensorView view = params.tensor_view(t);
  if (view.dtype() == DType::F32) {
    std::copy(v.begin(), v.end(), view.f32());
    return;
  }
  std::uint16_t* out = view.bf16();
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
}
const float* tensor_get(const SegmentChunksHold& params, const TensorSlot& t, std::vector<float>& scratch) {
  const TensorView view = params.tensor_view(t);
  if (view.dtype() == DType::F32) return view.f32();
  scratch.resize(t.numel);
  bf16_widen(scratch.data(), view.bf16(), t.numel);
  return scratch.data();
}
}  // namespace

namespace {
// p[0, n) = rng.normal() * std, n calls in order, made in fixed pieces on the pool (Rng::skip: the
// same values for any thread count); rng moves past them. About 21 ns a value on a thread; while
// the vector registers' upper halves were left dirty by the data file's checksum (Note [clean
// upper state] in core/hash.cpp) 265 ns, and GPT-2 small took 19 s to initialise on two cores.
void normal_fill(ThreadPool* pool, Rng& rng, float* p, std::size_t n, double std) {
  constexpr std::size_t kPiece = std::size_t{1} << 16;
  const std::uint64_t start = rng.state();
  auto run = [&](std::size_t first, std::size_t last) {
    for (std::size_t c = first; c < last; ++c) {
      Rng r(start);
      r.skip(2 * c * kPiece);
      const std::size_t end = std::min(n, (c + 1) * kPiece);
      for (std::size_t i = c * kPiece; i < end; ++i) p[i] = static_cast<float>(r.normal() * std);
    }
  };
  const std::size_t pieces = (n + kPiece - 1) / kPiece;
  if (pool != nullptr) pool->parallel_for(pieces, run);
  else run(0, pieces);
  rng.skip(2 * n);
}
}  // namespace

void model_init_random(const GptConfig& cfg, const ParamLayout& layout, SegmentStore& store, std::uint64_t seed,
                       ThreadPool* pool) {
  Rng rng(seed);
  std::vector<float> values;
  // transformers' LlamaPreTrainedModel: every weight N(0, 0.02), norms 1 (Gemma's 0: it norms by 1 + w,
  // Note [gemma]), (Qwen2's) biases 0
  if (cfg.llama()) {
    const float norm = 1.0f - cfg.norm_offset();
    for (int s = 0; s < layout.segment_count(); ++s) {
      if (!segment_selected(layout, s, SegmentSelect::Base)) continue;  // adapters: lora_init_random
      SegmentChunksHold params(store, s, SegmentKind::Params, Access::Overwrite);
      for (const auto& t : layout.segments()[s].tensors) {
        values.resize(t.numel);
        float* p = values.data();
        if (t.shape.size() == 1) {
          const bool bias = t.name.ends_with(".bias");
          std::fill(p, p + t.numel, bias ? 0.0f : norm);
        } else {
          normal_fill(pool, rng, p, t.numel, 0.02);
        }
        tensor_put(params, t, values);
      }
    }
    return;
  }
  const double residual_std = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  for (int s = 0; s < layout.segment_count(); ++s) {
    if (!segment_selected(layout, s, SegmentSelect::Base)) continue;  // adapters: lora_init_random
    SegmentChunksHold params(store, s, SegmentKind::Params, Access::Overwrite);
    for (const auto& t : layout.segments()[s].tensors) {
      values.resize(t.numel);
      float* p = values.data();
      const bool is_ln = t.name.find("ln_") != std::string::npos;
      const bool is_weight = t.name.size() >= 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
      if (is_ln) {
        std::fill(p, p + t.numel, is_weight ? 1.0f : 0.0f);
      } else if (!is_weight) {
        std::fill(p, p + t.numel, 0.0f);
      } else {
        const bool residual = t.name.find("c_proj.weight") != std::string::npos;
        const double std = residual ? residual_std : 0.02;
        normal_fill(pool, rng, p, t.numel, std);
      }
      tensor_put(params, t, values);
    }
  }
}

namespace {
// The tokenizer files a model directory gets (model_write_files), source name -> Hugging Face name.
constexpr std::pair<const char*, const char*> kTokenizerFiles[] = {
    {"tokenizer.json", "tokenizer.json"}, {"tokenizer_config.json", "tokenizer_config.json"},
    {"chat_template.jinja", "chat_template.jinja"},  // Note [chat template] in data/chat_template.h
    {"vocab.json", "vocab.json"},         {"merges.txt", "merges.txt"},
    {"encoder.json", "vocab.json"},       {"vocab.bpe", "merges.txt"}};

// The source model's sampling settings and stop tokens (Note [generation config] in model/hf_config.h).
constexpr const char* kGenerationConfig = "generation_config.json";

void copy_file(const std::string& from, const std::string& to) {
  file_write_atomic(to, file_read_all(from));
}

// Moves `tmp` into place at `dir` atomically; afterwards `tmp` holds the old directory (if any).
void dir_swap_in(const std::string& tmp, const std::string& dir) {
  if (!dir_exists(dir)) {
    STRATUM_CHECK(::rename(tmp.c_str(), dir.c_str()) == 0, "[model.save] cannot rename '", tmp, "' to '", dir,
                  "': ", std::strerror(errno));
    return;
  }
  if (::syscall(SYS_renameat2, AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) return;
  // File systems without RENAME_EXCHANGE: move the old one aside first (a crash in between
  // leaves the old model intact under the ".old" name).
  const std::string old = tmp + ".old";
  STRATUM_CHECK(::rename(dir.c_str(), old.c_str()) == 0, "[model.save] cannot move '", dir, "' aside: ",
                std::strerror(errno));
  STRATUM_CHECK(::rename(tmp.c_str(), dir.c_str()) == 0, "[model.save] cannot rename '", tmp, "' to '", dir,
                "': ", std::strerror(errno), " (the previous model is at '", old, "')");
  std::filesystem::rename(old, tmp);
}
}  // namespace

void model_write_files(const std::string& dir, const GptConfig& cfg, const ParamLayout& layout, SegmentStore& store,
                       const std::string& tokenizer_dir, bool weights, DType dtype, const std::string& model_dir) {
  hf_config_write(dir + "/config.json", cfg, dtype == DType::BF16 ? "bfloat16" : "float32");
  if (weights)
    write_kinds(dir + "/model.safetensors", layout, store, {{SegmentKind::Params, ""}}, {{"format", "pt"}},
                SegmentSelect::Base, "", dtype);
  if (!model_dir.empty() && file_exists(model_dir + "/" + kGenerationConfig))  // Note [generation config]
    copy_file(model_dir + "/" + kGenerationConfig, dir + "/" + kGenerationConfig);
  if (!tokenizer_dir.empty()) {
    // Every tokenizer file the source has, under Hugging Face names.
    std::set<std::string> written;
    for (const auto& [from, to] : kTokenizerFiles)
      if (file_exists(tokenizer_dir + "/" + from) && written.insert(to).second)
        copy_file(tokenizer_dir + "/" + from, dir + "/" + to);
  }
}

void model_save(const std::string& dir_in, const GptConfig& cfg, const ParamLayout& layout, SegmentStore& store,
                const std::string& tokenizer_dir, DType dtype, const std::string& model_dir) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string parent = std::filesystem::path(dir).parent_path().empty()
                                 ? std::string(".")
                                 : std::filesystem::path(dir).parent_path().string();
  STRATUM_CHECK(dir_exists(parent), "[model.save] parent directory '", parent, "' of '", dir,
                "' does not exist; create it first");
  STRATUM_CHECK(::access(parent.c_str(), W_OK) == 0, "[model.save] cannot write to '", parent, "': ",
                std::strerror(errno), "; choose another output directory");
  // Replaced only when it is what this writes (an earlier output): never a checkpoint, a --save
  // directory or a directory of other files, which the swap below would delete.
  if (std::filesystem::exists(dir)) {
    STRATUM_CHECK(dir_exists(dir), "[model.save] '", dir, "' exists and is not a directory; choose a new directory");
    std::set<std::string> ours = {"config.json", "model.safetensors", kGenerationConfig};
    for (const auto& [from, to] : kTokenizerFiles) ours.insert(to);
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      STRATUM_CHECK(entry.is_regular_file() && ours.count(entry.path().filename().string()) > 0, "[model.save] '",
                    dir, "' exists and holds '", entry.path().filename().string(),
                    "', which a model directory written here does not; choose a new directory (only an earlier "
                    "output is replaced)");
  }
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  dir_create(tmp);
  try {
    model_write_files(tmp, cfg, layout, store, tokenizer_dir, true, dtype, model_dir);
    dir_fsync(tmp);
    dir_swap_in(tmp, dir);
    dir_fsync(parent);
  } catch (...) {
    std::filesystem::remove_all(tmp, ec);
    throw;
  }
  std::filesystem::remove_all(tmp, ec);
}

std::uint64_t model_params_hash(const ParamLayout& layout, SegmentStore& store) {
  // XXH3-64 (core/hash.h) of every parameter's fp32 bit pattern, little-endian, in layout order
  // (a bf16 unit's widened: a frozen bf16 base hashes as its fp32 widening, Note [frozen bf16 base]).
  Hash64Stream hash;
  std::vector<float> values;
  for (int s = 0; s < layout.segment_count(); ++s) {
    SegmentChunksHold params(store, s, SegmentKind::Params, Access::Read);
    for (const auto& t : layout.segments()[s].tensors) {
      hash.update(tensor_get(params, t, values), t.numel * sizeof(float));
    }
  }
  return hash.digest();
}

}  // namespace stratum
