// Crash-safe checkpoints; see checkpoint.h and Note [checkpoints].
#include "train/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <span>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_descriptor.h"
#include "core/file_util.h"
#include "core/printable.h"
#include "formats/json_brief.h"
#include "formats/json_fields.h"
#include "core/hash.h"
#include "stratum/error.h"
#include "weights/model_io.h"

namespace stratum {

using nlohmann::json;

namespace {
constexpr const char* kStateFormat = "stratum.trainer_state";
constexpr const char* kManifestFormat = "stratum.checkpoint_manifest";
// Version 2: the manifest's file checksums, the params hash and the data hashes are XXH3-64
// (core/hash.h); version 1 used Stratum's own hashes, so its checkpoints are refused with both
// version numbers rather than verified against a hash this build no longer has. Version 3 adds
// the run id (Note [run identity]); version 2 is still read, as a run of unknown identity.
constexpr int kVersion = 3;
constexpr int kOldestVersion = 2;

// Reads fields of a JSON object strictly, naming `where` and the field in every error.

json parse_object(const std::string& text, const std::string& where, const char* format) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  STRATUM_CHECK(!root.is_discarded(), "[checkpoint] ", where, " is not valid JSON (truncated or corrupt?)");
  STRATUM_CHECK(root.is_object(), "[checkpoint] ", where, " must hold a JSON object, got ", json_brief(root));
  const JsonFields f(root, where, "checkpoint");
  STRATUM_CHECK(f.str("format") == format, "[checkpoint] ", where, ": format is '", f.str("format").substr(0, 60),
                "', expected '", format, "'");
  const std::int64_t version = f.integer("version", 0, std::numeric_limits<int>::max());
  STRATUM_CHECK(version >= kOldestVersion && version <= kVersion, "[checkpoint] ", where, ": version ", version,
                " is not supported (this stratum reads versions ", kOldestVersion, " to ", kVersion,
                "; resume an older checkpoint with the stratum that wrote it)");
  return root;
}

constexpr std::int64_t kMaxSteps = 1000000000;  // manifests
constexpr std::int64_t kMaxDim = 1 << 24;
}  // namespace

std::string trainer_state_json(const TrainerState& s) {
  json root = {
      {"format", kStateFormat},
      {"version", kVersion},
      {"step", s.step},
      {"model", s.model.empty() ? s.config.describe() : s.model},
      {"n_layer", s.config.n_layer},
      {"n_head", s.config.n_head},
      {"n_embd", s.config.n_embd},
      {"n_ctx", s.config.n_ctx},
      {"vocab_size", s.config.vocab_size},
      {"layer_norm_eps", s.config.layer_norm_eps},
      {"next_lr", s.next_lr},
      {"train_tokens", s.train_tokens},
      {"train_hash", hash_text(s.train_hash)},
      {"val_tokens", s.val_tokens},
      {"val_hash", hash_text(s.val_hash)},
      {"loss", s.loss},
      {"params_hash", hash_text(s.params_hash)},
      {"run_id", hash_text(s.run_id)},
  };
  for (const TrainOption& option : train_option_table()) root[option.key] = train_option_json(option, s);
  return root.dump(2) + "\n";
}

TrainerState trainer_state_parse(const std::string& text, const std::string& where) {
  const json root = parse_object(text, where, kStateFormat);
  const JsonFields f(root, where, "checkpoint");
  TrainerState s;
  for (const TrainOption& option : train_option_table()) train_option_read(option, f, s);
  s.step = f.integer("step", 1, s.steps);
  s.config.n_layer = static_cast<int>(f.integer("n_layer", 1, kMaxDim));
  s.config.n_head = static_cast<int>(f.integer("n_head", 1, kMaxDim));
  s.config.n_embd = static_cast<int>(f.integer("n_embd", 1, kMaxDim));
  s.config.n_ctx = static_cast<int>(f.integer("n_ctx", 1, kMaxDim));
  s.config.vocab_size = static_cast<int>(f.integer("vocab_size", 1, kMaxDim));
  s.config.layer_norm_eps = static_cast<float>(f.number("layer_norm_eps", 0, 1));
  s.model = f.str("model");
  constexpr double kBig = 1e30;
  s.next_lr = f.number("next_lr", 0, kBig);
  s.train_tokens = static_cast<std::uint64_t>(f.integer("train_tokens", 1, std::numeric_limits<std::int64_t>::max()));
  s.train_hash = f.hex("train_hash");
  s.val_tokens = static_cast<std::uint64_t>(f.integer("val_tokens", 0, std::numeric_limits<std::int64_t>::max()));
  s.val_hash = f.hex("val_hash");
  s.loss = static_cast<float>(f.number("loss", -kBig, kBig));
  s.params_hash = f.hex("params_hash");
  if (root.at("version").get<std::int64_t>() >= 3) s.run_id = f.hex("run_id");
  return s;
}

std::string manifest_json(const CheckpointManifest& m) {
  json files = json::array();
  for (const ManifestEntry& e : m.files)
    files.push_back({{"name", e.name}, {"bytes", e.bytes}, {"checksum", hash_text(e.checksum)}});
  const json root = {{"format", kManifestFormat}, {"version", kVersion}, {"step", m.step}, {"files", files}};
  return root.dump(2) + "\n";
}

CheckpointManifest manifest_parse(const std::string& text, const std::string& where) {
  const json root = parse_object(text, where, kManifestFormat);
  const JsonFields f(root, where, "checkpoint");
  CheckpointManifest m;
  m.step = f.integer("step", 1, kMaxSteps);
  const json& files = f.at("files");
  STRATUM_CHECK(files.is_array() && !files.empty() && files.size() <= 64, "[checkpoint] ", where,
                ": 'files' must be a non-empty array of at most 64 entries, got ", json_brief(files));
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string at = where + " files[" + std::to_string(i) + "]";
    STRATUM_CHECK(files[i].is_object(), "[checkpoint] ", at, " must be an object, got ", json_brief(files[i]));
    const JsonFields e(files[i], at, "checkpoint");
    ManifestEntry entry;
    entry.name = e.str("name");
    STRATUM_CHECK(!entry.name.empty() && entry.name.size() <= 255 && entry.name.find('/') == std::string::npos &&
                      entry.name != "." && entry.name != ".." && entry.name.find('\0') == std::string::npos,
                  "[checkpoint] ", at, ": name '", entry.name.substr(0, 60), "' is not a plain file name");
    for (const ManifestEntry& other : m.files)
      STRATUM_CHECK(other.name != entry.name, "[checkpoint] ", at, ": '", entry.name, "' is listed twice");
    entry.bytes = static_cast<std::uint64_t>(e.integer("bytes", 0, std::numeric_limits<std::int64_t>::max()));
    entry.checksum = e.hex("checksum");
    m.files.push_back(std::move(entry));
  }
  return m;
}

std::uint64_t file_checksum(const std::string& path) {
  FileDescriptor fd(file_open_read(path));
  STRATUM_CHECK(fd.get() >= 0, "[checkpoint] cannot open '", path, "': ", std::strerror(errno));
  constexpr std::size_t kPiece = std::size_t{8} << 20;
  std::unique_ptr<unsigned char[]> buffer(new unsigned char[kPiece]);
  Hash64Stream hash;
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer.get(), kPiece);
    if (n < 0 && errno == EINTR) continue;
    STRATUM_CHECK(n >= 0, "[checkpoint] read error on '", path, "': ", std::strerror(errno));
    if (n == 0) break;
    hash.update(buffer.get(), static_cast<std::size_t>(n));
  }
  return hash.digest();
}

std::string checkpoint_name(long step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08ld", step);
  return name;
}

namespace {
// The files every checkpoint has (the tokenizer files are optional; optimizer.safetensors, or its
// shards from a data-parallel run, are required of AdamW runs: zo-sgd keeps no optimizer state; the weights are model.safetensors, or
// for LoRA runs the PEFT adapter's two files).
const char* const kRequired[] = {"config.json", "trainer_state.json"};
const char* const kRequiredModel[] = {"model.safetensors"};
const char* const kRequiredAdapter[] = {"adapter_config.json", "adapter_model.safetensors"};

std::string trim_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// The step of a checkpoint_list name ("step-00000012": 12).
long checkpoint_step_of(const std::string& name) { return std::strtol(name.c_str() + 5, nullptr, 10); }

}  // namespace

std::vector<std::string> checkpoint_list(const std::string& root) {
  std::vector<std::pair<long, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    long step = 0;
    char rest = 0;
    if (name.size() == 13 && std::sscanf(name.c_str(), "step-%8ld%c", &step, &rest) == 1 && step > 0 &&
        name == checkpoint_name(step) && entry.is_directory(ec))
      found.emplace_back(step, name);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& [step, name] : found) out.push_back(std::move(name));
  return out;
}

namespace {
std::string read_latest(const std::string& root) {
  const std::string path = root + "/latest";
  if (!file_exists(path) || file_size_bytes(path) > 64) return "";
  std::string name = file_read_all(path);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name;
}
}  // namespace

LatestStatus checkpoint_latest(const std::string& root_in) {
  const std::string root = trim_slashes(root_in);
  LatestStatus st;
  const std::string path = root + "/latest";
  if (!file_exists(path)) {
    std::error_code ec;
    const std::filesystem::file_status link = std::filesystem::symlink_status(path, ec);
    st.problem = !std::filesystem::exists(link)        ? "'latest' is missing"
                 : std::filesystem::is_symlink(link) && !std::filesystem::exists(path, ec)
                     ? "'latest' is a symbolic link to nothing"
                     : "'latest' is not a file";
    return st;
  }
  if (file_size_bytes(path) > 64) {
    st.problem = "'latest' is not a checkpoint name (" + std::to_string(file_size_bytes(path)) + " bytes)";
    return st;
  }
  const std::string name = read_latest(root);
  const std::vector<std::string> all = checkpoint_list(root);
  if (name.empty()) st.problem = "'latest' is empty";
  else if (std::find(all.begin(), all.end(), name) != all.end()) st.name = name;
  else if (name.rfind("step-", 0) == 0 && name.find('/') == std::string::npos)
    st.problem = "'latest' names '" + printable_text(name) + "', which does not exist";
  else
    st.problem = "'latest' names '" + printable_text(name.substr(0, 40)) + "', which is not a checkpoint of this directory";
  return st;
}

CheckpointCheck checkpoint_verify(const std::string& dir_in) {
  CheckpointCheck check;
  check.dir = trim_slashes(dir_in);
  try {
    STRATUM_CHECK(dir_exists(check.dir), "'", check.dir, "' is not a directory");
    const std::string manifest_path = check.dir + "/manifest.json";
    STRATUM_CHECK(file_exists(manifest_path), "manifest.json is missing (an unfinished or foreign directory)");
    const std::string text = file_read_all(manifest_path);
    STRATUM_CHECK(text.size() <= (1 << 20), "manifest.json is too large to be a manifest");
    const CheckpointManifest m = manifest_parse(text, manifest_path);
    check.step = m.step;
    for (const char* required : kRequired) {
      const bool listed = std::any_of(m.files.begin(), m.files.end(),
                                      [&](const ManifestEntry& e) { return e.name == required; });
      STRATUM_CHECK(listed, "manifest.json does not list ", required);
    }
    for (const ManifestEntry& e : m.files) {
      const std::string path = check.dir + "/" + e.name;
      std::string line = e.name + ": ";
      if (!file_exists(path)) {
        check.report.push_back(line + "MISSING");
        if (check.problem.empty()) check.problem = e.name + " is missing";
        continue;
      }
      const std::uint64_t bytes = file_size_bytes(path);
      if (bytes != e.bytes) {
        check.report.push_back(line + "WRONG SIZE (" + std::to_string(bytes) + " bytes, manifest says " +
                               std::to_string(e.bytes) + ")");
        if (check.problem.empty())
          check.problem = e.name + " has " + std::to_string(bytes) + " bytes, the manifest says " +
                          std::to_string(e.bytes) + " (truncated?)";
        continue;
      }
      if (file_checksum(path) != e.checksum) {
        check.report.push_back(line + "CHECKSUM MISMATCH");
        if (check.problem.empty()) check.problem = e.name + " does not match its checksum (corrupt)";
        continue;
      }
      check.report.push_back(line + "ok (" + std::to_string(bytes) + " bytes)");
    }
    if (check.problem.empty()) {
      // The trainer state must parse and agree with the manifest.
      const std::string state_path = check.dir + "/trainer_state.json";
      check.state = trainer_state_parse(file_read_all(state_path), state_path);
      const TrainerState& state = check.state;
      STRATUM_CHECK(state.step == m.step, "trainer_state.json says step ", state.step, ", the manifest ", m.step);
      auto listed = [&](const std::string& name) {
        return std::any_of(m.files.begin(), m.files.end(), [&](const ManifestEntry& e) { return e.name == name; });
      };
      std::vector<std::string> names;
      for (const ManifestEntry& e : m.files) names.push_back(e.name);
      STRATUM_CHECK(!optimizer_files(names).empty() || state.optimizer != TrainOptimizer::AdamW,
                    "manifest.json lists neither optimizer.safetensors nor a complete set of optimizer shards");
      for (const char* required : state.lora_r > 0 ? std::span<const char* const>(kRequiredAdapter)
                                                   : std::span<const char* const>(kRequiredModel))
        STRATUM_CHECK(listed(required), "manifest.json does not list ", required);
    }
  } catch (const Error& e) {
    if (check.problem.empty()) check.problem = e.what();
  }
  return check;
}

namespace {
constexpr const char* kOwnerFile = "run";  // ROOT/run: the run that owns the root
constexpr const char* kOwnerPrefix = "stratum-run ";
constexpr const char* kSaveLockFile = "stratum-save.lock";

// Leftovers of writes that never finished (a run killed while writing a checkpoint, moving
// `latest` or pruning old checkpoints aside): never a complete checkpoint. Called by the one run
// that holds the root's lock, when it claims the root (a resumed run that has no step left to
// write still leaves the root clean) and before every checkpoint it writes.
void leftovers_remove(const std::string& root) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string leftover = entry.path().filename().string();
    if ((leftover.rfind(".step-", 0) == 0 || leftover.rfind("latest.tmp.", 0) == 0 ||
         leftover.rfind(std::string(kOwnerFile) + ".tmp.", 0) == 0) &&
        leftover.find(".tmp.") != std::string::npos)
      std::filesystem::remove_all(entry.path(), ec);
  }
}
}  // namespace

std::string checkpoint_write(const std::string& root_in, long step, int keep,
                             const std::function<void(const std::string& tmp_dir)>& write_files, long abandon_after) {
  STRATUM_CHECK(keep >= 1, "[checkpoint] --keep must be at least 1");
  const std::string root = trim_slashes(root_in);
  dir_create(root);
  STRATUM_CHECK(::access(root.c_str(), W_OK) == 0, "[checkpoint] cannot write to '", root,
                "': permission denied; choose another --save directory");
  const std::string name = checkpoint_name(step);
  const std::string final_dir = root + "/" + name;
  leftovers_remove(root);
  std::error_code ec;
  const std::string tmp = root + "/." + name + ".tmp." + std::to_string(::getpid());
  dir_create(tmp);
  try {
    write_files(tmp);
    CheckpointManifest manifest;
    manifest.step = step;
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(tmp)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    for (const std::string& file : names) {
      STRATUM_CHECK(file != "manifest.json", "[checkpoint] bug: write_files wrote manifest.json");
      manifest.files.push_back({file, file_size_bytes(tmp + "/" + file), file_checksum(tmp + "/" + file)});
    }
    file_write_atomic(tmp + "/manifest.json", manifest_json(manifest));
    dir_fsync(tmp);
    // Read back and verified before it gets its final name: a checkpoint that does not verify is
    // never left under step-NNNNNNNN (the renames below do not change a byte).
    const CheckpointCheck check = checkpoint_verify(tmp);
    STRATUM_CHECK(check.ok(), "[checkpoint] the checkpoint just written for step ", step,
                  " does not verify: ", check.problem, "; 'latest' still names the previous one");
    if (dir_exists(final_dir)) {
      // A checkpoint of this step exists (a resume from an older one after this one failed to
      // verify): move it aside, to be removed once the new one is in place.
      const std::string aside = root + "/." + name + ".tmp." + std::to_string(::getpid()) + ".old";
      STRATUM_CHECK(::rename(final_dir.c_str(), aside.c_str()) == 0, "[checkpoint] cannot move '", final_dir,
                    "' aside: ", std::strerror(errno));
      std::filesystem::remove_all(aside, ec);
    }
    STRATUM_CHECK(::rename(tmp.c_str(), final_dir.c_str()) == 0, "[checkpoint] cannot rename '", tmp, "' to '",
                  final_dir, "': ", std::strerror(errno));
  } catch (...) {
    std::filesystem::remove_all(tmp, ec);
    throw;
  }
  dir_fsync(root);
  file_write_atomic(root + "/latest", name + "\n");
  // The abandoned future (see checkpoint.h), then all but the newest `keep` (never this one).
  int kept = 0;
  for (const std::string& other : checkpoint_list(root)) {  // newest first
    if (other == name) {
      ++kept;
      continue;
    }
    const bool abandoned = abandon_after >= 0 && checkpoint_step_of(other) > abandon_after;
    if (!abandoned && ++kept <= keep) continue;
    // Out of sight first (a leftover's name, removed by the next write if this one is killed).
    const std::string doomed = root + "/." + other + ".tmp." + std::to_string(::getpid()) + ".old";
    if (::rename((root + "/" + other).c_str(), doomed.c_str()) == 0) std::filesystem::remove_all(doomed, ec);
  }
  dir_fsync(root);
  return final_dir;
}

long checkpoint_peak_more(long have, long saves, int keep) {
  return std::max(1L, std::min(have + saves - 1, static_cast<long>(keep)) + 1 - have);
}

ResumePoint checkpoint_find(const std::string& path_in) {
  const std::string path = trim_slashes(path_in);
  STRATUM_CHECK(dir_exists(path), "[checkpoint] --resume '", path, "' does not exist or is not a directory");
  ResumePoint point;
  if (file_exists(path + "/manifest.json")) {
    const CheckpointCheck check = checkpoint_verify(path);
    STRATUM_CHECK(check.ok(), "[checkpoint] '", path, "' cannot be resumed: ", check.problem,
                  "; give its parent directory to resume from the newest checkpoint that verifies");
    point.dir = path;
    point.step = check.step;
    point.state = check.state;
    return point;
  }
  const LatestStatus latest_status = checkpoint_latest(path);
  const std::string& latest = latest_status.name;
  std::vector<std::string> candidates;
  if (latest_status.ok()) candidates.push_back(latest);
  else if (!checkpoint_list(path).empty()) point.notes.push_back(latest_status.problem);
  for (const std::string& name : checkpoint_list(path))
    if (name != latest) candidates.push_back(name);
  STRATUM_CHECK(!candidates.empty(), "[checkpoint] '", path,
                "' holds no checkpoint (no step-NNNNNNNN directory); train with --save '", path, "' first");
  std::uint64_t owner = checkpoint_root_owner(path);  // Note [run identity]
  for (const std::string& name : candidates) {
    const CheckpointCheck check = checkpoint_verify(path + "/" + name);
    if (check.ok() && owner != 0 && check.state.run_id != 0 && check.state.run_id != owner) {
      point.notes.push_back("skipped " + name + ": written by another run (run " + hash_text(check.state.run_id) +
                            ", this directory's is " + hash_text(owner) + ")");
      continue;
    }
    if (check.ok()) {
      if (owner == 0) owner = check.state.run_id;
      point.dir = check.dir;
      point.step = check.step;
      point.state = check.state;
      return point;
    }
    point.notes.push_back("skipped " + name + ": " + check.problem);
  }
  std::string why;
  for (const std::string& note : point.notes) why += "; " + note;
  STRATUM_FAIL("[checkpoint] no checkpoint under '", path, "' verifies", why);
}

std::uint64_t run_id_new() {
  std::random_device device;
  std::uint64_t id = 0;
  while (id == 0) {
    const std::uint64_t words[3] = {(static_cast<std::uint64_t>(device()) << 32) ^ device(),
                                    static_cast<std::uint64_t>(
                                        std::chrono::steady_clock::now().time_since_epoch().count()),
                                    static_cast<std::uint64_t>(::getpid())};
    id = hash64(words, sizeof words);
  }
  return id;
}

std::uint64_t checkpoint_root_owner(const std::string& root) {
  const std::string path = trim_slashes(root) + "/" + kOwnerFile;
  if (!file_exists(path) || file_size_bytes(path) > 64) return 0;
  const std::string text = file_read_all(path);
  const std::string prefix = kOwnerPrefix;
  if (text.rfind(prefix, 0) != 0) return 0;
  const std::string hex = text.substr(prefix.size(), 16);  // as hex64 writes it (JsonFields::hex reads the same)
  if (hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) return 0;
  return std::strtoull(hex.c_str(), nullptr, 16);
}

DirLock checkpoint_root_claim(const std::string& root_in, std::uint64_t run_id, const std::string& resumed_from) {
  const std::string root = trim_slashes(root_in);
  DirLock lock(root, kSaveLockFile,
               "[train] another stratum run is saving into --save '" + root + "'; give each run its own directory");
  leftovers_remove(root);  // ours now: a killed run's unfinished writes go
  const std::vector<std::string> existing = checkpoint_list(root);
  if (!existing.empty()) {
    std::uint64_t owner = checkpoint_root_owner(root);
    for (std::size_t i = 0; owner == 0 && i < existing.size(); ++i) {  // a root without ROOT/run
      try {
        const std::string state = root + "/" + existing[i] + "/trainer_state.json";
        if (file_exists(state)) owner = trainer_state_parse(file_read_all(state), state).run_id;
      } catch (const Error&) {  // unreadable: the next one says
      }
    }
    std::error_code ec;
    const bool resumed_here =
        !resumed_from.empty() && std::filesystem::weakly_canonical(std::filesystem::path(resumed_from).parent_path(), ec) ==
                                     std::filesystem::weakly_canonical(root, ec);
    const bool ours = owner != 0 ? owner == run_id : resumed_here;
    STRATUM_CHECK(ours, "[train] --save '", root, "' already holds checkpoints of another run (newest ", existing[0],
                  "); continue that run with --resume ", root, ", or choose another --save directory");
  }
  if (checkpoint_root_owner(root) != run_id) {
    try {
      file_write_atomic(root + "/" + kOwnerFile, kOwnerPrefix + hash_text(run_id) + "\n");
    } catch (const BugError&) {
      throw;
    } catch (const Error& e) {
      STRATUM_FAIL("[train] --save '", root, "': recording the run that owns it failed: ", e.what(),
                   "; free space on that disk or choose another --save directory");
    }
  }
  return lock;
}

bool checkpoint_dir_check(const std::string& dir_in, const char* component) {
  const std::string dir = trim_slashes(dir_in);
  if (!file_exists(dir + "/manifest.json")) return false;
  const CheckpointCheck check = checkpoint_verify(dir);
  STRATUM_CHECK(check.ok(), "[", component, "] '", dir, "' does not match its manifest: ", check.problem,
                "; `stratum verify ", dir, "` checks every file (resume from an older checkpoint if it is damaged)");
  return true;
}

std::string checkpoint_model_dir(const std::string& path_in, std::vector<std::string>* notes) {
  const std::string path = trim_slashes(path_in);
  if (path.empty() || file_exists(path + "/config.json") || !dir_exists(path)) return path_in;
  if (!file_exists(path + "/latest") && checkpoint_list(path).empty()) return path_in;  // not a root
  const LatestStatus latest = checkpoint_latest(path);
  // What `latest` names is a checkpoint, which readers check against its manifest
  // (checkpoint_dir_check); one without its manifest is unfinished or damaged, not a plain
  // Hugging Face directory to read unchecked.
  if (latest.ok() && file_exists(path + "/" + latest.name + "/manifest.json")) return path + "/" + latest.name;
  // The same fallback as --resume: the newest checkpoint that verifies, saying why.
  ResumePoint point = checkpoint_find(path);
  if (notes != nullptr) {
    for (std::string& note : point.notes) notes->push_back(std::move(note));
    notes->push_back("using " + point.dir);
  }
  return point.dir;
}

}  // namespace stratum
