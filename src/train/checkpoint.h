// Crash-safe training checkpoints (Note [checkpoints]): the directory layout, the trainer state
// and manifest files (writing and strict parsing), writing a checkpoint atomically, verifying one
// against its checksums, and finding the checkpoint to resume from. Does not know how a model's
// tensors are stored (the trainer passes a function that writes them) and does not train.
//
// Note [checkpoints]: `--save ROOT` makes ROOT a checkpoint root:
//   ROOT/step-00000200/  config.json, model.safetensors (a Hugging Face GPT-2 directory, loadable
//                        by GPT2LMHeadModel), vocab.json + merges.txt (when the run has a
//                        tokenizer), optimizer.safetensors (AdamW's moments; none with zo-sgd,
//                        which keeps no optimizer state; from P ranks one shard per rank,
//                        optimizer-0000R-of-0000P.safetensors, written by each rank into the
//                        temporary directory, Note [zero sharding] in exec/executor.h), trainer_state.json
//                        (step, options, data identity, LR), manifest.json (every other file's
//                        size and checksum)
//   ROOT/latest          the name of the newest verified checkpoint ("step-00000200")
// A checkpoint is written under ROOT/.step-NNNNNNNN.tmp.PID: each file atomically and fsynced,
// then the manifest is computed by reading every file back, the directory is fsynced and the
// checkpoint verified against its manifest (one that does not verify never gets a final name),
// renamed to step-NNNNNNNN, ROOT is fsynced, and only then is `latest` replaced (atomically) and
// the oldest checkpoints beyond --keep removed, each renamed to a temporary name first so that a
// kill mid-delete never leaves a half-deleted step-NNNNNNNN. A crash at any moment leaves every
// earlier checkpoint and `latest` intact; leftovers of an unfinished write or delete are
// temporary directories, removed by the next write. Resuming verifies the checkpoint
// first; from a root it takes `latest` and falls back to the newest older checkpoint that
// verifies, saying which and why.
// Note [run identity]: a run gets a random 64-bit id when it starts fresh and keeps it across
// resumes; every checkpoint's trainer state carries it, and a root records the run that owns it
// (ROOT/run, "stratum-run <hex>"). A run locks its root while it uses it (ROOT/stratum-save.lock),
// refuses a root holding checkpoints of another run, and resuming from a root never falls back to
// a checkpoint another run wrote. Version-2 checkpoints, written before identities, have none
// (run_id 0) and are taken as the root's own.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dir_lock.h"
#include "model/model_config.h"
#include "train/train_options.h"

namespace stratum {

// Everything a run needs to continue exactly where it stopped, besides the tensors. The data
// loader's order is a pure function of (seed, shuffle, batch index) and the only randomness in a
// step-by-step run is the initialisation, so "RNG state" is the seed and "loader position" is the
// step.
struct TrainerState : TrainSettings {  // the run's options (Note [option table]), plus:
  long step = 0;         // optimizer steps done
  GptConfig config;      // the GPT-2 shape fields (a checkpoint's config.json has the whole config)
  std::string model;     // config.describe() of the model trained (family and every shape field)
  double next_lr = 0;    // the LR of step `step` (informational)
  std::uint64_t train_tokens = 0, train_hash = 0;  // data identity (hash64 of the tokens)
  std::uint64_t val_tokens = 0, val_hash = 0;
  float loss = 0;                   // the loss of the last step done
  std::uint64_t params_hash = 0;    // model_params_hash of the saved weights
  std::uint64_t run_id = 0;         // Note [run identity]; 0: unknown (a version-2 checkpoint)
};
std::string trainer_state_json(const TrainerState& state);
// Strict: every field present with the right type and range; throws Error naming `where` and the
// field.
TrainerState trainer_state_parse(const std::string& text, const std::string& where);

struct ManifestEntry {
  std::string name;  // a plain file name in the checkpoint directory
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;  // file_checksum
};
struct CheckpointManifest {
  long step = 0;
  std::vector<ManifestEntry> files;
};
std::string manifest_json(const CheckpointManifest& manifest);
CheckpointManifest manifest_parse(const std::string& text, const std::string& where);  // strict, throws Error

// hash64 (XXH3-64, core/hash.h) of the file's bytes, read in 8 MiB pieces.
std::uint64_t file_checksum(const std::string& path);

// "step-00000200"
std::string checkpoint_name(long step);

// The checkpoint directory names under `root` (step-NNNNNNNN only), newest first; none when
// `root` is not a directory.
std::vector<std::string> checkpoint_list(const std::string& root);

// Verifies a checkpoint directory against its manifest: every file present, with its size and
// checksum, and no file the checkpoint needs missing from the manifest. `report` gets one line per
// file. Never throws for a bad checkpoint: `problem` says what is wrong (empty = good).
struct CheckpointCheck {
  std::string dir;
  long step = -1;
  std::vector<std::string> report;
  std::string problem;
  TrainerState state;  // the checkpoint's trainer state (when ok())
  bool ok() const { return problem.empty(); }
};
CheckpointCheck checkpoint_verify(const std::string& dir);

// Writes checkpoint `step` under `root` (created if missing) as Note [checkpoints] says:
// write_files(tmp_dir) writes everything but manifest.json into tmp_dir. Keeps the newest `keep`
// checkpoints (>= 1). Returns the new checkpoint's directory. Throws Error when anything fails;
// the previous checkpoints and `latest` are then untouched and the temporary directory removed.
// abandon_after >= 0 (a resumed run's first save, from that step): the root's checkpoints of later
// steps are a future the run abandoned by resuming from an older one; once the new checkpoint is
// in place they are removed before the --keep count (they pushed out the run's own, and a
// resume's fallback to "the newest that verifies" would have taken them).
std::string checkpoint_write(const std::string& root, long step, int keep,
                             const std::function<void(const std::string& tmp_dir)>& write_files,
                             long abandon_after = -1);

// How many checkpoints more than the `have` under a root it holds at its peak while `saves` more
// are written with --keep `keep`: each is written before those beyond `keep` are removed, so the
// root peaks at keep + 1 (at least one more: the next one).
long checkpoint_peak_more(long have, long saves, int keep);

// The checkpoint to resume from: `path` itself when it is a checkpoint directory (it must verify),
// else the root's `latest`, else (when that is missing or does not verify) the newest step-*
// directory that verifies. `notes` says what was skipped and why. Throws Error when none verifies.
struct ResumePoint {
  std::string dir;
  long step = 0;
  TrainerState state;  // as verified
  std::vector<std::string> notes;
};
ResumePoint checkpoint_find(const std::string& path);

// Note [run identity]: a new random run id (never 0).
std::uint64_t run_id_new();
// The run that owns checkpoint root `root` (ROOT/run); 0 when it does not say.
std::uint64_t checkpoint_root_owner(const std::string& root);
// Claims `root` for run `run_id` before the run trains: creates it, locks it for the returned
// lock's life, refuses a root that holds checkpoints of another run (naming how to resume it or
// to choose another directory), and records the run as its owner. resumed_from: the checkpoint
// directory the run continues ("" for a fresh run); a root of unknown owner (version 2) is taken
// over only by a run resumed from inside it.
DirLock checkpoint_root_claim(const std::string& root, std::uint64_t run_id, const std::string& resumed_from);

// Note [checked reads]: every reader of a model directory (train --model, generate, info) that is
// a checkpoint (it holds manifest.json) checks it against its manifest before using it, and fails
// in one line naming what does not match and `stratum verify`. Returns false, checking nothing,
// for a plain Hugging Face directory (no manifest: its files are not checksummed; the loader still
// checks every tensor's name, shape and finiteness). component: the error prefix ("generate").
bool checkpoint_dir_check(const std::string& dir, const char* component);

// What ROOT/latest says (Note [checkpoints]): the checkpoint it names, or why it names none
// (missing, empty, not a name, a checkpoint that does not exist). The one reading of `latest`:
// resume, the readers of --model and verify all take it from here.
struct LatestStatus {
  std::string name;     // "step-00000200" when ok()
  std::string problem;  // "'latest' is empty", ...
  bool ok() const { return problem.empty(); }
};
LatestStatus checkpoint_latest(const std::string& root);

// For --model: a checkpoint root (no config.json; a `latest` file or step-N directories) stands
// for the checkpoint `latest` names or, when that is broken or names a directory without its
// manifest.json, the newest one that verifies (the fallback --resume uses; `notes` gets why and
// which); any other path is returned unchanged.
// Throws Error when no checkpoint of the root verifies.
std::string checkpoint_model_dir(const std::string& path, std::vector<std::string>* notes = nullptr);

}  // namespace stratum
