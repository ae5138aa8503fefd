// Moving named tensors between safetensors files and store units, shared by the model's files
// (weights/model_io.h) and LoRA adapter files (weights/adapter_io.h). Implemented in model_io.cpp.
// Does not know what a model directory or an adapter directory holds.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/param_layout.h"
#include "store/segment_store.h"

namespace stratum {

// Which segments a file holds: every one, the base model's, the LoRA adapters' (Note [lora
// segments]) or the trainable ones (whose optimizer state exists).
enum class SegmentSelect { All, Base, Adapters, Trainable };
bool segment_selected(const ParamLayout& layout, int s, SegmentSelect select);

// Loads the tensors of `paths` (the shards of one model, or one file) into the store: a tensor
// named PREFIX + NAME + SUFFIX, with NAME a tensor of a selected segment (with or without GPT-2's
// "transformer."), goes to the units of `kind` for `suffix` (Note [vocab blocks]: a slot may hold
// a row range of it). `ignore` says which other names may be present; every selected tensor must
// be found once per (kind, suffix) across the files. `expect` (may be null) names the file each
// tensor must be in (a sharded model's index). `keep` (may be null): the selected segments whose
// tensors go to the store; the others' are checked for presence, shape and dtype only (a data-parallel
// rank's share of the optimizer state, Note [zero sharding]). store null: every tensor is only
// checked (`stratum info`).
void load_kinds(const std::vector<std::string>& paths, const ParamLayout& layout, SegmentStore* store,
                const std::vector<std::pair<SegmentKind, std::string>>& kinds,
                const std::function<bool(const std::string&)>& ignore, const char* what,
                const std::map<std::string, std::string>* expect, SegmentSelect select,
                const std::string& prefix = "", const std::function<bool(int)>* keep = nullptr);

// Writes the selected segments' units of each (kind, suffix) as PREFIX + HF name + SUFFIX F32
// tensors in Hugging Face shapes, one chunk held at a time (so it works under a memory budget);
// wte, split into vocabulary blocks, is one tensor written piece by piece (first, as Hugging
// Face does).
// out: F32, or BF16 (fp32 values rounded nearest-even, bf16 units as held). keep (may be null):
// only those of the selected segments (a data-parallel rank's optimizer shard, Note [zero
// sharding]); every segment holding a piece of a written tensor must be kept.
void write_kinds(const std::string& path, const ParamLayout& layout, SegmentStore& store,
                 const std::vector<std::pair<SegmentKind, std::string>>& kinds,
                 const std::map<std::string, std::string>& metadata, SegmentSelect select,
                 const std::string& prefix = "", DType out = DType::F32,
                 const std::function<bool(int)>* keep = nullptr);

}  // namespace stratum
