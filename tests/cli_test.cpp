// The `stratum` command as a user runs it: bad flags and bad files each give one clear line and
// a non-zero exit (never a crash), and prepare/info/generate work end to end.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "data/token_file.h"
#include "gpt2_byte_symbol.h"
#include "integration_util.h"
#include "train/train_options.h"

namespace stratum {
namespace {

using testing::run_stratum;
using testing::shared_data;
using testing::source_path;

const std::string kTiny = source_path("tests/golden/tiny_gpt2");

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

struct BadCase {
  std::string name;
  std::string args;
  std::string expect_in_error;
};

TEST(Cli, BadInputGetsOneClearLineAndNonZeroExit) {
  testing::TempDir tmp;
  // Fixtures: truncated safetensors, config missing a field, invalid tokenizer JSON, empty corpus,
  // token ids beyond the tiny model's vocabulary.
  const std::string truncated = tmp.file("truncated");
  std::filesystem::create_directory(truncated);
  std::filesystem::copy_file(kTiny + "/config.json", truncated + "/config.json");
  const std::string good = file_read_all(kTiny + "/model.safetensors");
  write_text(truncated + "/model.safetensors", good.substr(0, good.size() / 2));
  const std::string noconfig = tmp.file("noconfig");
  std::filesystem::create_directory(noconfig);
  write_text(noconfig + "/config.json", R"({"model_type": "gpt2", "n_layer": 2, "n_head": 4})");
  std::filesystem::copy_file(kTiny + "/model.safetensors", noconfig + "/model.safetensors");
  // config.json promises C=64 but the weights are C=32; and a copy whose wpe is stored as I32.
  const std::string wrongshape = tmp.file("wrongshape");
  std::filesystem::create_directory(wrongshape);
  write_text(wrongshape + "/config.json",
             R"({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 64, "vocab_size": 101})");
  std::filesystem::copy_file(kTiny + "/model.safetensors", wrongshape + "/model.safetensors");
  const std::string wrongdtype = tmp.file("wrongdtype");
  std::filesystem::create_directory(wrongdtype);
  std::filesystem::copy_file(kTiny + "/config.json", wrongdtype + "/config.json");
  {
    const SafetensorsFile src = SafetensorsFile::open(kTiny + "/model.safetensors");
    std::vector<std::vector<char>> bytes;
    std::vector<SafetensorsWriteEntry> entries;
    for (const auto& t : src.tensors()) {
      bytes.emplace_back(t.size_bytes);
      src.read_raw(t, bytes.back().data());
      entries.push_back({t.name, t.name == "transformer.wpe.weight" ? DType::I32 : t.dtype, t.shape,
                         bytes.back().data()});
    }
    safetensors_write(wrongdtype + "/model.safetensors", entries);
  }
  const std::string badtok = tmp.file("badtok");
  std::filesystem::create_directory(badtok);
  write_text(badtok + "/encoder.json", "{not json");
  write_text(badtok + "/vocab.bpe", "#version: 0.2\n");
  write_text(tmp.file("empty.txt"), "");
  write_text(tmp.file("text.txt"), "hello world\n");
  token_file_write_raw_u16(tmp.file("big_ids.bin"), {1, 2, 3, 500, 4, 5});
  write_text(tmp.file("odd.bin"), "abc");
  std::filesystem::create_symlink(tmp.file("loop"), tmp.file("loop"));
  // GPT-2's vocab.bpe cut to its first 1000 lines (it read as a tokenizer that splits words
  // into more, shorter tokens), and text with one stray byte at its end (read as token ids).
  const std::string shortbpe = tmp.file("shortbpe");
  std::filesystem::create_directory(shortbpe);
  std::filesystem::copy_file(shared_data("encoder.json"), shortbpe + "/encoder.json");
  {
    const std::string bpe = file_read_all(shared_data("vocab.bpe"));
    std::size_t at = 0;
    for (int line = 0; line < 1000; ++line) at = bpe.find('\n', at) + 1;
    write_text(shortbpe + "/vocab.bpe", bpe.substr(0, at));
  }
  const std::string hugecfg = tmp.file("hugecfg");  // ~200 GB of weights claimed: refused before reading them
  std::filesystem::create_directory(hugecfg);
  write_text(hugecfg + "/config.json", R"({"model_type": "gpt2", "n_layer": 1024, "n_head": 16, "n_embd": 2048, )"
                                       R"("n_positions": 64, "vocab_size": 101})");
  std::filesystem::copy_file(kTiny + "/model.safetensors", hugecfg + "/model.safetensors");
  std::filesystem::create_directories(tmp.file("binroot/step-00000001"));
  write_text(tmp.file("binroot/latest"), std::string("\xff\x01step\n", 7));
  // The same for a tokenizer.json's merges, and a Llama config.json with num_key_value_heads 0
  // (read as absent: the error named a tensor's shape).
  const std::string shortjson = tmp.file("shortjson");
  std::filesystem::create_directory(shortjson);
  {
    nlohmann::json t = nlohmann::json::parse(file_read_all(source_path("tests/golden/tokenizer_json/llama3_style/tokenizer.json")));
    auto& merges = t["model"]["merges"];
    merges.erase(merges.begin() + 200, merges.end());
    write_text(shortjson + "/tokenizer.json", t.dump());
  }
  const std::string kv0 = tmp.file("kv0");
  std::filesystem::copy(source_path("tests/golden/tiny_llama"), kv0, std::filesystem::copy_options::recursive);
  {
    nlohmann::json c = nlohmann::json::parse(file_read_all(kv0 + "/config.json"));
    c["num_key_value_heads"] = 0;
    write_text(kv0 + "/config.json", c.dump());
  }
  write_text(tmp.file("stray.txt"), file_read_all(shared_data("tinyshakespeare.txt")).substr(0, 9998) + "\xff" + "a");

  const std::string data = " --data " + kTiny + "/tokens.bin";
  const std::vector<BadCase> cases = {
      {"no command", "", "usage"},
      {"unknown command", "frobnicate", "unknown command"},
      {"unknown flag", "train --bogus 1" + data, "unknown flag '--bogus'"},
      {"missing value", "train --steps", "needs a value"},
      {"bad integer", "train --steps ten" + data, "expects an integer"},
      {"bad number", "train --lr fast" + data, "expects a number"},
      {"negative steps", "train --steps -3" + data, "--steps must be in"},
      {"bad schedule", "train --lr-schedule linear" + data, "--lr-schedule"},
      {"no data", "train --steps 1", "--data FILE is required"},
      {"missing data file", "train --data " + tmp.file("nope.bin"), "does not exist"},
      {"data is a directory", "train --data " + tmp.path(), "is a directory"},
      {"data is a device", "train --data /dev/null", "is not a regular file"},
      {"data is a link loop", "train --data " + tmp.file("loop"), "symbolic link loop"},
      {"empty corpus", "train --data " + tmp.file("empty.txt") + " --tokenizer " + shared_data(""), "empty"},
      {"text without tokenizer", "train --data " + tmp.file("text.txt"), "--tokenizer"},
      {"odd-sized token file", "train --data " + tmp.file("odd.bin"), "[data.tokens]"},
      {"token id >= vocab", "train --model " + kTiny + " --data " + tmp.file("big_ids.bin"), "outside the model's vocabulary"},
      {"seq longer than context", "train --model " + kTiny + data + " --seq 65", "longer than the model context"},
      {"model and shape flags", "train --model " + kTiny + " --layers 2" + data, "drop --layers"},
      {"heads do not divide embd", "train --embd 30 --heads 4" + data, "divisible"},
      {"missing model dir", "train --model " + tmp.file("nomodel") + data, "does not exist"},
      {"truncated safetensors", "train --model " + truncated + data, "[safetensors]"},
      {"config missing field", "train --model " + noconfig + data, "n_embd"},
      {"weights shape mismatch", "train --model " + wrongshape + data, "but config.json implies"},
      {"weights of integer dtype", "train --model " + wrongdtype + data, "[safetensors]"},
      {"tokenizer not JSON", "prepare --input " + tmp.file("text.txt") + " --tokenizer " + badtok + " --out " +
                                 tmp.file("x.bin"), "[tokenizer]"},
      {"prepare missing flags", "prepare --input " + tmp.file("text.txt"), "needs --input"},
      {"generate without model", "generate --prompt hi", "--model DIR is required"},
      {"generate prompt too long", "generate --model " + kTiny + " --tokenizer " + shared_data("") +
                                       " --prompt \"$(printf 'word %.0s' $(seq 100))\"", "longer than the model context"},
      {"generate negative temperature", "generate --model " + kTiny + " --temperature -1", "--temperature"},
      {"info missing path", "info " + tmp.file("nothing"), "does not exist"},
      {"save-every without save", "train --save-every 2" + data, "--save-every needs --save"},
      {"unwritable log", "train --steps 1 --log /proc/nope/log.jsonl" + data, "[log]"},
      {"unwritable save", "train --steps 1 --save /proc/nope/ck" + data, "--save"},
      {"keep zero", "train --keep 0 --save " + tmp.file("ck") + data, "--keep"},
      {"negative lr", "train --lr -1" + data, "--lr must be in [0,"},
      {"beta1 above one", "train --beta1 1.5" + data, "--beta1 must be in [0, 1]"},
      {"negative seed", "train --seed -1" + data, "--seed"},
      {"resume missing", "train --resume " + tmp.file("nothing"), "does not exist"},
      {"resume a model dir", "train --resume " + kTiny, "no checkpoint"},
      {"resume with --model", "train --resume " + kTiny + " --model " + kTiny, "no checkpoint"},
      {"verify missing", "verify " + tmp.file("nothing"), "does not exist"},
      {"verify a model dir", "verify " + kTiny, "neither a checkpoint"},
      {"offload dir with no budget", "train --mem-budget 0 --offload-dir " + tmp.path() + data,
       "--offload-dir needs --mem-budget SIZE"},
      {"gpu budget on the cpu", "train --steps 1 --gpu-mem-budget 1G" + data, "add --backend cuda"},
      {"bad adamw place", "train --steps 1 --adamw-on disk" + data, "--adamw-on must be 'auto', 'gpu' or 'cpu'"},
      {"adamw place on the cpu", "train --steps 1 --adamw-on cpu" + data, "--adamw-on chooses between the GPU"},
      {"generate gpu budget on the cpu", "generate --model " + kTiny + " --prompt-ids 1,2 --gpu-mem-budget 1G",
       "add --backend cuda"},
      {"prefetch without a budget", "train --prefetch 2" + data, "--prefetch only applies"},
      {"truncated vocab.bpe", "prepare --input " + tmp.file("text.txt") + " --tokenizer " + shortbpe + " --out " +
                                  tmp.file("x.bin"), "come from none of them"},
      {"tokenizer.json merges cut short", "prepare --input " + tmp.file("text.txt") + " --tokenizer " + shortjson +
                                              " --out " + tmp.file("x.bin"), "come from none of them"},
      {"llama kv heads 0", "train --model " + kv0 + data, "num_key_value_heads must be >= 1"},
      {"text with a stray byte", "train --data " + tmp.file("stray.txt") + " --tokenizer " + shared_data(""),
       "is UTF-8 text up to byte 9998"},
      {"prepare a token file", "prepare --input " + kTiny + "/tokens.bin --tokenizer " + shared_data("") + " --out " +
                                   tmp.file("x.bin"), "is not read as text (byte 1 is not UTF-8)"},
      {"prepare into a directory", "prepare --input " + tmp.file("text.txt") + " --tokenizer " + shared_data("") +
                                       " --out " + tmp.path(), "is a directory"},
      {"size beyond any machine", "train --mem-budget 99999999T --offload-dir " + tmp.path() + data,
       "is beyond any machine"},
      {"model larger than RAM", "train --layers 1024 --heads 16 --embd 2048 --ctx 64 --steps 1" + data,
       "of RAM and this machine has"},
      {"generate a model larger than RAM", "generate --model " + hugecfg + " --prompt-ids 1", "--mem-budget SIZE"},
      {"model dir is a file", "train --model " + kTiny + "/config.json" + data, "is a file"},
      {"lora flags without lora", "train --lora-alpha 16 --steps 1" + data, "add --lora-r R"},
      {"adamw option with zo-sgd", "train --optimizer zo-sgd --grad-clip 0.5 --steps 1" + data,
       "--grad-clip is AdamW's"},
      {"eval-batches without eval", "train --eval-batches 2 --steps 1" + data, "add --eval-every N"},
      {"plan lora flags without lora", "plan --layers 1 --heads 2 --embd 32 --ctx 64 --lora-alpha 8",
       "add --lora-r R to plan adapters"},
      {"trace is the save dir", "train --steps 1 --save " + tmp.file("sv") + " --trace " + tmp.file("sv") + data,
       "is the --save directory"},
      {"log is a directory", "train --steps 1 --log " + tmp.path() + data, "is a directory; give a file path"},
      {"lora without a base", "train --lora-r 4 --steps 1" + data, "give it with --model HF_DIR"},
      {"zo-eps with adamw", "train --zo-eps 0.001 --steps 1" + data, "add --optimizer zo-sgd"},
      {"save into a model dir", "train --steps 1 --save " + kTiny + data, "is a checkpoint or model directory"},
      {"generate prefetch without a budget", "generate --model " + kTiny + " --prompt-ids 1 --prefetch 3",
       "--prefetch only applies"},
      {"raw bytes quoted", "train --resume " + tmp.file("binroot"), "names '\\xff\\x01step'"},
      {"plan network rate", "plan --layers 1 --heads 2 --embd 32 --ctx 64 --ranks 2 --grad-accum 2 --net-gbps -1",
       "--net-gbps must be > 0"},
      {"hex size", "train --mem-budget 0x20M --offload-dir " + tmp.path() + data, "expects a size like 512M"},
      {"hex number", "train --lr 0x1p-10 --steps 1" + data, "--lr expects a number"},
      {"keep without save", "train --keep 3 --steps 1" + data, "add --save DIR"},
      {"range in full", "train --io-block 2G --mem-budget 64M --offload-dir " + tmp.path() + data,
       "must be in [4096, 1073741824], got 2147483648"},
      {"size under a byte", "plan --mem-budget 0.4 --offload-dir " + tmp.path(), "is less than one byte"},
      {"plan shape flags with a model", "plan --model " + kTiny + " --layers 3", "drop --layers"},
      {"plan zo-sgd keeps internals", "plan --optimizer zo-sgd --activations keep", "[cli] --activations keep"},
      {"plan network rate too small", "plan --layers 1 --heads 2 --embd 32 --ctx 64 --ranks 2 --grad-accum 2 --net-gbps 1e-300",
       "between 0.001 and 1000000"},
  };
  for (const auto& c : cases) {
    const auto r = run_stratum(c.args);
    EXPECT_NE(r.exit_code, 0) << c.name;
    EXPECT_LT(r.exit_code, 64) << c.name << ": crashed or reported a bug: " << r.errors;
    EXPECT_NE(r.errors.find(c.expect_in_error), std::string::npos)
        << c.name << ": expected '" << c.expect_in_error << "' in: " << r.errors;
    // The error itself is a single line starting with "stratum: [component]" (usage text aside).
    const auto pos = r.errors.find("stratum: [");
    if (c.expect_in_error != "usage") {
      ASSERT_NE(pos, std::string::npos) << c.name << ": " << r.errors;
      const std::string rest = r.errors.substr(pos);
      EXPECT_EQ(rest.find('\n'), rest.size() - 1) << c.name << ": error is not one line: " << rest;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(tmp.file("sv"))) << "a refused run claimed its --save directory";
}

// info checks the weights against config.json as train and generate do (it described a model
// whose config named a layer the weights lack, and exited 0).
// A vocabulary past uint16 (Llama 3's 128256, Qwen2's 151936 ids): `prepare` writes an llm.c
// shard of uint32 ids unless told --format raw, which it refuses with one line; train reads it.
TEST(Cli, PrepareWritesLargeIdsToAUint32Shard) {
  testing::TempDir tmp;
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[testing::gpt2_byte_symbol(b)] = b;
  nlohmann::json added = nlohmann::json::array();  // ids 256.. in file order; "<|big|>" last, at 65600
  for (int id = 256; id <= 65600; ++id)
    added.push_back({{"id", id}, {"content", id == 65600 ? "<|big|>" : "<|t" + std::to_string(id) + "|>"},
                     {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                     {"special", true}});
  const nlohmann::json tok = {
      {"version", "1.0"}, {"normalizer", nullptr},
      {"added_tokens", added},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::filesystem::create_directories(tmp.file("tok"));
  write_text(tmp.file("tok/tokenizer.json"), tok.dump());
  std::string text;
  for (int i = 0; i < 40; ++i) text += "some text <|big|> and more\n";
  write_text(tmp.file("text.txt"), text);
  const std::string prepare = "prepare --input " + tmp.file("text.txt") + " --tokenizer " + tmp.file("tok") + " --out ";
  const auto r = testing::run_stratum(prepare + tmp.file("wide.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("max id 65600"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("an llm.c shard of uint32 ids"), std::string::npos) << r.errors;
  const TokenFileData data = token_file_read(tmp.file("wide.bin"));
  EXPECT_EQ(data.format, TokenFileFormat::LlmcShard);
  EXPECT_EQ(std::count(data.tokens.begin(), data.tokens.end(), 65600), 40);
  const auto raw = testing::run_stratum(prepare + tmp.file("raw.bin") + " --format raw");
  EXPECT_EQ(raw.exit_code, 1);
  EXPECT_NE(raw.errors.find("token ids reach 65600, above the 65535 a raw uint16 file holds"), std::string::npos)
      << raw.errors;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("raw.bin")));
  const auto train = testing::run_stratum("train --layers 1 --heads 2 --embd 32 --ctx 32 --vocab 65601 --batch 2 "
                                          "--seq 16 --steps 1 --quiet --data " + tmp.file("wide.bin"));
  EXPECT_EQ(train.exit_code, 0) << train.errors;
}

TEST(Cli, InfoChecksTheWeightsAgainstTheConfig) {
  testing::TempDir tmp;
  const std::string model = testing::source_path("tests/golden/tiny_gpt2");
  auto r = testing::run_stratum("info " + model);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.output.find("weights: every tensor config.json implies is there"), std::string::npos) << r.output;
  const std::string bad = tmp.file("bad");
  std::filesystem::create_directories(bad);
  std::filesystem::copy_file(model + "/model.safetensors", bad + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(file_read_all(model + "/config.json"));
  config["n_layer"] = 3;
  std::ofstream(bad + "/config.json") << config.dump();
  r = testing::run_stratum("info " + bad);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("L3"), std::string::npos) << r.output;  // described first
  EXPECT_NE(r.errors.find("tensor 'transformer.h.2."), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("is missing"), std::string::npos) << r.errors;
  EXPECT_EQ(std::count(r.errors.begin(), r.errors.end(), '\n'), 1) << r.errors;
}

// Output that cannot be written is an error: info, generate and version into a full device
// exited 0 with nothing written.
TEST(Cli, OutputThatCannotBeWrittenFails) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  testing::TempDir tmp;
  const std::string model = testing::source_path("tests/golden/tiny_gpt2");
  for (const std::string& args : {std::string("version"), "info " + model,
                                  "generate --model " + model + " --prompt-ids 1,2 --max-tokens 3 --quiet"}) {
    const std::string cmd = std::string(STRATUM_BINARY) + " " + args + " >/dev/full 2>" + tmp.file("err");
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << args;
    const std::string errors = file_read_all(tmp.file("err"));
    EXPECT_NE(errors.find("No space left on device"), std::string::npos) << args << ": " << errors;
  }
}

// A run never overwrites its own inputs, and --log never truncates a file that is not a Stratum
// log (before: --log or --trace naming the data file, prepare --out naming --input and report
// --out naming the log all destroyed the input; --resume --log ate any file).
TEST(Cli, OutputsNeverOverwriteInputsOrForeignFiles) {
  testing::TempDir tmp;
  const std::string tokens = testing::write_random_tokens(tmp.file("tokens.bin"), 4000, 512, 3);
  const std::string original = file_read_all(tokens);
  const std::string train = "train --layers 1 --heads 2 --embd 32 --ctx 32 --vocab 512 --batch 2 --seq 16 --steps 2 "
                            "--quiet --data " + tokens;
  const std::string notes = tmp.file("notes.txt");
  write_text(notes, "my notes, not a log\n");
  write_text(tmp.file("corpus.txt"), "some text to tokenize\n");
  const struct {
    std::string args;
    const char* words;
  } cases[] = {
      {train + " --log " + tokens, "is the --data file"},
      {train + " --trace " + tmp.path() + "/./tokens.bin", "is the --data file"},
      {train + " --log " + notes, "exists and is not a Stratum training log"},
      {"prepare --input " + tmp.file("corpus.txt") + " --tokenizer " + testing::source_path("../shared/data") +
           " --out " + tmp.file("corpus.txt"),
       "is the --input file"},
      {"report " + notes + " --out " + notes, "is the log being read"},
      {train + " --trace " + notes, "exists and is not a Stratum trace"},
      {"report " + notes + " --out " + tmp.path(), "is a directory"},
      {"report " + tokens + " --out " + notes, "exists and is not an SVG"},
  };
  for (const auto& c : cases) {
    const auto r = testing::run_stratum(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << ": " << r.errors;
    EXPECT_NE(r.errors.find(c.words), std::string::npos) << c.args << ": " << r.errors;
  }
  EXPECT_EQ(file_read_all(tokens), original);
  EXPECT_EQ(file_read_all(notes), "my notes, not a log\n");
  EXPECT_EQ(file_read_all(tmp.file("corpus.txt")), "some text to tokenize\n");
  // A Stratum log and a Stratum trace are ours to replace.
  const auto ok = testing::run_stratum(train + " --log " + tmp.file("log.jsonl") + " --trace " + tmp.file("t.json"));
  ASSERT_EQ(ok.exit_code, 0) << ok.errors;
  EXPECT_EQ(testing::run_stratum(train + " --log " + tmp.file("log.jsonl") + " --trace " + tmp.file("t.json")).exit_code,
            0);
  // A log whose last record a killed run cut off is reported without it (it was refused whole).
  std::string log = file_read_all(tmp.file("log.jsonl"));
  write_text(tmp.file("cut.jsonl"), log.substr(0, log.size() - 10));
  auto r = testing::run_stratum("report " + tmp.file("cut.jsonl") + " --out " + tmp.file("cut.svg"));
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.output.find("(1 steps)"), std::string::npos) << r.output;
  EXPECT_NE(r.errors.find("line 2 is cut off"), std::string::npos) << r.errors;
  // merge --out replaces an earlier merge's output only: never a --save root, an input or a
  // directory of other files (it swapped any of them away, rc 0).
  const std::string base = tmp.file("base"), lora = tmp.file("lora");
  ASSERT_EQ(testing::run_stratum(train + " --save " + base).exit_code, 0);
  ASSERT_EQ(testing::run_stratum("train --model " + base + " --lora-r 2 --batch 2 --seq 16 --steps 2 --quiet --data " +
                                 tokens + " --save " + lora).exit_code, 0);
  const std::string merge = "merge --model " + base + " --adapter " + lora + " --out ";
  std::filesystem::create_directory(tmp.file("mine"));
  write_text(tmp.file("mine/notes.txt"), "mine\n");
  for (const auto& [out, words] : {std::pair<std::string, std::string>{lora, "a checkpoint or --save directory"},
                                   {base + "/step-00000002", "is an input"}, {tmp.file("mine"), "holds 'notes.txt'"},
                                   {lora + "/step-00000002/merged", "is inside " + lora + "/step-00000002"},
                                   {base + "/merged", "is inside " + base + ","}}) {
    r = testing::run_stratum(merge + out);
    EXPECT_EQ(r.exit_code, 1) << out;
    EXPECT_NE(r.errors.find(words), std::string::npos) << out << ": " << r.errors;
  }
  EXPECT_EQ(testing::run_stratum("verify " + lora).exit_code, 0);
  EXPECT_EQ(file_read_all(tmp.file("mine/notes.txt")), "mine\n");
  for (int i = 0; i < 2; ++i) {  // a new directory, then the same again: replaced
    r = testing::run_stratum(merge + tmp.file("merged"));
    EXPECT_EQ(r.exit_code, 0) << r.errors;
  }
}

// A pipe, device or socket given as an input or as --log/--trace is refused at once with one line:
// prepare --input, report, --log and --trace named a FIFO waited for a writer (or reader) forever,
// deaf to Ctrl-C. A /proc file, which says it holds 0 bytes, is read to its end.
TEST(Cli, PipesAndDevicesAreRefusedWithoutWaiting) {
  testing::TempDir tmp;
  const std::string fifo = tmp.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string tokens = testing::write_random_tokens(tmp.file("tokens.bin"), 4000, 512, 3);
  const std::string train = "train --layers 1 --heads 2 --embd 32 --ctx 32 --vocab 512 --batch 2 --seq 16 --steps 1 "
                            "--quiet --data " + tokens;
  std::filesystem::create_directory(tmp.file("tok"));
  std::filesystem::copy_file(shared_data("vocab.bpe"), tmp.file("tok/vocab.bpe"));
  ASSERT_EQ(::mkfifo(tmp.file("tok/encoder.json").c_str(), 0644), 0);
  write_text(tmp.file("text.txt"), "some text to tokenize\n");
  const struct {
    std::string args;
    std::string words;
  } cases[] = {
      {"prepare --input " + fifo + " --tokenizer " + shared_data("") + " --out " + tmp.file("x.bin"),
       "is not a regular file"},
      {"prepare --input " + tmp.file("text.txt") + " --tokenizer " + tmp.file("tok") + " --out " + tmp.file("x.bin"),
       "[tokenizer]"},
      {"report " + fifo, "is not a regular file"},
      {train + " --log " + fifo, "--log '" + fifo + "' is a device, pipe or socket"},
      {train + " --trace " + fifo, "--trace '" + fifo + "' is a device, pipe or socket"},
      {"train --layers 1 --heads 2 --embd 32 --ctx 32 --vocab 512 --seq 16 --data " + fifo, "is not a regular file"},
      {"info " + fifo, "is not a regular file"},
      {"generate --model " + kTiny + " --prompts " + fifo, "is not a regular file"},
      // Outputs: a pipe is not replaced by a file (report --out /dev/full made /dev/full one).
      {"prepare --input " + tmp.file("text.txt") + " --tokenizer " + shared_data("") + " --out " + fifo,
       "is a device, pipe or socket"},
      {"report " + tmp.file("log.jsonl") + " --out " + fifo, "is a device, pipe or socket"},
  };
  ASSERT_EQ(testing::run_stratum(train + " --log " + tmp.file("log.jsonl")).exit_code, 0);
  for (const auto& c : cases) {
    const auto r = testing::run_stratum(c.args, 60);
    EXPECT_EQ(r.exit_code, 1) << c.args << ": " << r.errors;
    EXPECT_NE(r.errors.find(c.words), std::string::npos) << c.args << ": " << r.errors;
    EXPECT_EQ(std::count(r.errors.begin(), r.errors.end(), '\n'), 1) << c.args << ": " << r.errors;
  }
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  EXPECT_NE(file_read_all("/proc/self/status").find("VmRSS"), std::string::npos);
  // A symbolic link as an output is written through: the link stays, its target is the report.
  std::filesystem::create_directory(tmp.file("reports"));
  std::filesystem::create_symlink(tmp.file("reports/real.svg"), tmp.file("link.svg"));
  const auto r = testing::run_stratum("report " + tmp.file("log.jsonl") + " --out " + tmp.file("link.svg"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_TRUE(std::filesystem::is_symlink(tmp.file("link.svg")));
  EXPECT_NE(file_read_all(tmp.file("reports/real.svg")).find("<svg"), std::string::npos);
}

// --max-tokens beyond the model's context stops at the context, saying so (it stopped silently).
TEST(Cli, GenerationThatFillsTheContextSaysSo) {
  const auto r = testing::run_stratum("generate --model " + testing::source_path("tests/golden/tiny_gpt2") +
                                      " --prompt-ids 1,2,3 --max-tokens 500 --temperature 0 --no-stop");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("prompt 1 stopped after 61 tokens: the context is full (--max-tokens 500"), std::string::npos)
      << r.errors;
}

// Ids in and no tokenizer to make text of the output: the generated ids come out, as
// --output-ids prints them (before, an empty line: the tokens were lost).
TEST(Cli, GenerationWithoutATokenizerPrintsTheIds) {
  const std::string gen = "generate --model " + testing::source_path("tests/golden/tiny_gpt2") +
                          " --prompt-ids 1,2,3 --max-tokens 4 --temperature 0 --no-stop";
  const auto text = testing::run_stratum(gen);
  const auto ids = testing::run_stratum(gen + " --output-ids");
  ASSERT_EQ(text.exit_code, 0) << text.errors;
  ASSERT_EQ(ids.exit_code, 0) << ids.errors;
  EXPECT_EQ(text.output, ids.output);
  EXPECT_EQ(std::count(text.output.begin(), text.output.end(), ','), 3) << text.output;
  EXPECT_NE(text.errors.find("has no tokenizer to print text with: printed the token ids"), std::string::npos)
      << text.errors;
}

// Ctrl-C during a streamed generation stops after the token, keeps what was printed and removes
// the offload files (they stayed: 70 MB for a small model, until the next run in that directory).
TEST(Cli, InterruptedStreamedGenerationRemovesItsOffloadFiles) {
  testing::TempDir tmp;
  const std::string tokens = testing::write_random_tokens(tmp.file("tokens.bin"), 4000, 50257, 3);
  auto r = testing::run_stratum("train --layers 1 --heads 2 --embd 32 --ctx 1024 --vocab 50257 --batch 1 --seq 16 "
                                "--steps 1 --quiet --data " + tokens + " --save " + tmp.file("model"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  std::filesystem::create_directory(tmp.file("off"));
  testing::StratumProcess p("generate --model " + tmp.file("model") + " --tokenizer " + shared_data("") +
                            " --prompt hello --max-tokens 1000 --no-stop --temperature 0 --mem-budget 16M --offload-dir " +
                            tmp.file("off"));
  for (int i = 0; i < 2000 && p.running() && p.output_so_far().size() < 8; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  p.signal(SIGINT);
  r = p.wait();
  if (r.exit_code == 0) GTEST_SKIP() << "the generation finished before the signal";
  EXPECT_EQ(r.exit_code, 130) << r.errors;
  EXPECT_NE(r.errors.find("interrupted after"), std::string::npos) << r.errors;
  EXPECT_EQ(r.output.rfind("hello", 0), 0u) << r.output;
  EXPECT_TRUE(std::filesystem::is_empty(tmp.file("off"))) << "offload files left behind";
}

// Ctrl-C during `stratum plan`'s measurement stops it and removes the measurement's offload files
// (they stayed, 13 GiB for a large model, until the next plan or train in that directory).
TEST(Cli, InterruptedPlanMeasurementRemovesItsFiles) {
  testing::TempDir tmp;
  const std::string off = tmp.file("off");
  std::filesystem::create_directory(off);
  testing::StratumProcess p("plan --layers 4 --heads 8 --embd 512 --ctx 1024 --vocab 50257 --batch 2 --seq 1024 "
                            "--mem-budget 400M --offload-dir " + off);
  auto measuring = [&] {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(off, ec))
      if (e.path().filename().string().rfind("stratum-plan-", 0) == 0) return true;
    return false;
  };
  for (int i = 0; i < 3000 && p.running() && !measuring(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // To the plan only (a terminal's Ctrl-C reaches the measuring process too); SIGTERM, as a
  // scheduler sends: the message said "signal 2 (Interrupt)", the one forwarded to the child.
  p.signal(SIGTERM);
  const auto r = p.wait();
  if (r.exit_code == 0) GTEST_SKIP() << "the plan finished before the signal";
  EXPECT_EQ(r.exit_code, 1) << r.errors;
  EXPECT_NE(r.errors.find("stopped by a signal before the measurement finished"), std::string::npos) << r.errors;
  EXPECT_EQ(r.errors.find("Interrupt"), std::string::npos) << r.errors;
  EXPECT_FALSE(measuring()) << "the measurement's files were left behind";
}

// A refused generation prints nothing on stdout (it echoed the prompt before checking its options).
TEST(Cli, RefusedGenerationPrintsNothing) {
  const std::string model = testing::source_path("tests/golden/tiny_gpt2");
  for (const std::string& bad : {std::string(" --top-p 5"), std::string(" --temperature -1")}) {
    const auto r = testing::run_stratum("generate --model " + model + " --tokenizer " + shared_data("") +
                                        " --prompt 'hello there'" + bad);
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_EQ(r.output, "") << bad;
  }
  // The prompt is still echoed when nothing is generated ("a" is one byte-level token, id 64).
  const auto r = testing::run_stratum("generate --model " + model + " --tokenizer " + shared_data("") +
                                      " --prompt a --max-tokens 0");
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(r.output, "a\n");
}

TEST(Cli, HelpAndVersion) {
  EXPECT_EQ(run_stratum("--help").exit_code, 0);
  const auto r = run_stratum("train --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--grad-clip"), std::string::npos);
  EXPECT_NE(run_stratum("version").output.find("stratum "), std::string::npos);
}

TEST(Cli, PrepareInfoTrainGenerateEndToEnd) {
  testing::TempDir tmp;
  // 20 KB of Tiny Shakespeare, tokenized with the GPT-2 BPE, as both token formats.
  const std::string text = file_read_all(shared_data("tinyshakespeare.txt")).substr(0, 20000);
  write_text(tmp.file("corpus.txt"), text);
  auto r = run_stratum("prepare --input " + tmp.file("corpus.txt") + " --tokenizer " + shared_data("") + " --out " +
                       tmp.file("train.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  r = run_stratum("prepare --format llmc --input " + tmp.file("corpus.txt") + " --tokenizer " + shared_data("") +
                  " --out " + tmp.file("train.shard"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_EQ(token_file_read(tmp.file("train.bin")).tokens, token_file_read(tmp.file("train.shard")).tokens);
  r = run_stratum("info " + tmp.file("train.shard"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("llmc-shard"), std::string::npos) << r.output;

  // Train the same model from the text file (tokenized on the fly), the .bin and the shard:
  // identical tokens => identical parameters (the hash is printed).
  const std::string model = " --layers 1 --heads 2 --embd 32 --ctx 64 --batch 2 --seq 32 --steps 5 --quiet --threads 2";
  const auto hash_of = testing::params_hash_of;
  r = run_stratum("train" + model + " --data " + tmp.file("train.bin") + " --save " + tmp.file("model") +
                  " --tokenizer " + shared_data(""));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const std::string hash = hash_of(r.errors);
  ASSERT_EQ(hash.size(), 16u);
  r = run_stratum("train" + model + " --data " + tmp.file("train.shard"));
  EXPECT_EQ(hash_of(r.errors), hash);
  // Every flag of the option table parses: the default seed given explicitly gives the same bits,
  // and the largest seed is accepted.
  r = run_stratum("train" + model + " --data " + tmp.file("train.bin") + " --seed 1337 --lr-schedule cosine");
  EXPECT_EQ(hash_of(r.errors), hash) << r.errors;
  r = run_stratum("train" + model + " --data " + tmp.file("train.bin") + " --seed 9223372036854775807 --shuffle");
  EXPECT_EQ(r.exit_code, 0) << r.errors;
  // Every other valued flag of the option table, each at its default: the same bits.
  std::string defaults;
  for (const TrainOption& option : train_option_table()) {
    const std::string value = train_option_text(option, TrainSettings{});
    if (*option.value_name == '\0' || value.empty()) continue;  // switches, paths
    if (model.find(std::string(" --") + option.flag + " ") != std::string::npos) continue;  // given above
    if (std::string(option.flag).rfind("lora-", 0) == 0 || std::string(option.flag) == "zo-eps" ||
        std::string(option.flag) == "keep" || std::string(option.flag) == "eval-batches")
      continue;  // refused without --lora-r / --optimizer zo-sgd, which change the bits, or --save
    defaults += std::string(" --") + option.flag + " " + value;
  }
  r = run_stratum("train" + model + " --data " + tmp.file("train.bin") + defaults);
  EXPECT_EQ(hash_of(r.errors), hash) << defaults << "\n" << r.errors;
  r = run_stratum("train" + model + " --data " + tmp.file("corpus.txt") + " --tokenizer " + shared_data(""));
  EXPECT_EQ(hash_of(r.errors), hash);
  // Read by content (Note [data by content]): the text named .bin is text, the token file named
  // .txt is tokens; each says which reading it chose. Before, the first trained on the text's
  // bytes as uint16 ids and the second was refused as text.
  std::filesystem::copy_file(tmp.file("corpus.txt"), tmp.file("corpus.bin"));
  r = run_stratum("train" + model + " --data " + tmp.file("corpus.bin") + " --tokenizer " + shared_data(""));
  EXPECT_EQ(hash_of(r.errors), hash) << r.errors;
  EXPECT_NE(r.errors.find("holds UTF-8 text: reading it as text"), std::string::npos) << r.errors;
  std::filesystem::copy_file(tmp.file("train.bin"), tmp.file("tokens.txt"));
  r = run_stratum("train" + model + " --data " + tmp.file("tokens.txt"));
  EXPECT_EQ(hash_of(r.errors), hash) << r.errors;
  EXPECT_NE(r.errors.find("reading it as raw uint16 token ids"), std::string::npos) << r.errors;

  r = run_stratum("info " + tmp.file("model"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("vocab.json + merges.txt"), std::string::npos) << r.output;

  // Generation: greedy is deterministic; sampling is deterministic per seed; text streams out.
  const std::string gen = "generate --model " + tmp.file("model") + " --prompt 'ROMEO:' --max-tokens 12 --no-stop";
  const auto g1 = run_stratum(gen + " --temperature 0");
  const auto g2 = run_stratum(gen + " --temperature 0");
  ASSERT_EQ(g1.exit_code, 0) << g1.errors;
  EXPECT_EQ(g1.output, g2.output);
  EXPECT_EQ(g1.output.rfind("ROMEO:", 0), 0u);
  EXPECT_GT(g1.output.size(), std::string("ROMEO:\n").size());
  EXPECT_NE(g1.errors.find("generated: 12 tokens"), std::string::npos) << g1.errors;
  const auto s1 = run_stratum(gen + " --temperature 1 --top-k 20 --seed 5");
  const auto s2 = run_stratum(gen + " --temperature 1 --top-k 20 --seed 5");
  EXPECT_EQ(s1.output, s2.output);
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// A Llama directory with a tokenizer.json: info names the family, every shard and the tokenizer;
// --prompt-ids-file runs a batch of id prompts (one JSON line each, the same ids as each prompt
// alone); a budget that spills the KV cache says how much it wrote.
TEST(Cli, LlamaInfoAndIdPromptsFile) {
  testing::TempDir tmp;
  const std::string model = tmp.file("llama");
  std::filesystem::copy(source_path("tests/golden/tiny_llama"), model);
  std::filesystem::copy_file(source_path("tests/golden/tokenizer_json/llama3_style/tokenizer.json"),
                             model + "/tokenizer.json");
  auto r = run_stratum("info " + model);
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.output.find("Llama model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokenizer: tokenizer.json, byte-level BPE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model-00002-of-00002.safetensors"), std::string::npos) << r.output;

  // Spaces around ids and a blank line are what a hand-written file has (they were refused).
  write_text(tmp.file("ids.txt"), " 5, 9,2 \n  \n17,3,3,8,1\n");
  const std::string gen = "generate --model " + model + " --temperature 0 --max-tokens 6 --no-stop --output-ids";
  const auto one = [&](const std::string& ids) {
    const auto g = run_stratum(gen + " --prompt-ids " + ids);
    EXPECT_EQ(g.exit_code, 0) << g.errors;
    return g.output.substr(0, g.output.find('\n'));
  };
  const std::string a = one("5,9,2"), b = one("17,3,3,8,1");
  r = run_stratum(gen + " --prompt-ids-file " + tmp.file("ids.txt") + " --batch 2");
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  // The empty line is skipped, saying so; each record names its prompt's line in the file.
  EXPECT_NE(r.output.find("{\"prompt\":1,\"line\":1,\"ids\":[" + a + "]"), std::string::npos) << r.output << " vs " << a;
  EXPECT_NE(r.output.find("{\"prompt\":2,\"line\":3,\"ids\":[" + b + "]"), std::string::npos) << r.output << " vs " << b;
  EXPECT_NE(r.errors.find("1 empty line(s) skipped"), std::string::npos) << r.errors;
  std::filesystem::create_directory(tmp.file("off"));
  const auto spilled = run_stratum(gen + " --prompt-ids-file " + tmp.file("ids.txt") + " --batch 2 --mem-budget 1M" +
                                   " --offload-dir " + tmp.file("off"));
  EXPECT_NE(spilled.exit_code, 0);
  EXPECT_NE(spilled.errors.find("is below the minimum of "), std::string::npos) << spilled.errors;
  const auto at = spilled.errors.find("use --mem-budget ");
  ASSERT_NE(at, std::string::npos) << spilled.errors;
  const std::string minimum = spilled.errors.substr(at + 17, spilled.errors.find(' ', at + 17) - at - 17);
  r = run_stratum(gen + " --prompt-ids-file " + tmp.file("ids.txt") + " --batch 2 --mem-budget " + minimum +
                  " --offload-dir " + tmp.file("off") + " --trace " + tmp.file("gen_trace.json"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  EXPECT_NE(r.errors.find("GB/s while reading"), std::string::npos) << r.errors;
  // The trace shows each layer's compute and the units read from the offload dir.
  const std::string trace = file_read_all(tmp.file("gen_trace.json"));
  EXPECT_NE(trace.find("\"layer.1\""), std::string::npos);
  EXPECT_NE(trace.find("\"head\""), std::string::npos);
  EXPECT_NE(trace.find("\"layer.0.params"), std::string::npos) << "a read of layer 0's weights";
  EXPECT_NE(r.output.find("[" + a + "]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[" + b + "]"), std::string::npos) << r.output;
  EXPECT_NE(r.errors.find("KV cache spilled: "), std::string::npos) << r.errors;
  EXPECT_EQ(r.errors.find("KV cache spilled: 0.0 MiB"), std::string::npos) << r.errors;

  r = run_stratum(gen + " --prompt-ids-file " + tmp.file("ids.txt") + " --prompt-ids 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.errors.find("give one of"), std::string::npos) << r.errors;
  write_text(tmp.file("bad.txt"), "1,2\n3,x\n");
  r = run_stratum(gen + " --prompt-ids-file " + tmp.file("bad.txt"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.errors.find("'x'"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find("--prompt-ids-file " + tmp.file("bad.txt") + " line 2"), std::string::npos) << r.errors;
}

// A bf16 Llama is kept in bf16 (Note [bf16 weights]) and says so; --fp32-weights widens it and
// gives the same ids, and its smallest budget is larger.
TEST(Cli, Bf16LlamaIsKeptInBf16) {
  const std::string gen = "generate --model " + source_path("tests/golden/tiny_llama_bf16") +
                          " --temperature 0 --max-tokens 8 --no-stop --output-ids --prompt-ids 4,8,15,16";
  const auto kept = run_stratum(gen);
  ASSERT_EQ(kept.exit_code, 0) << kept.errors;
  EXPECT_NE(kept.errors.find("MiB bf16 (kept as stored)"), std::string::npos) << kept.errors;
  const auto wide = run_stratum(gen + " --fp32-weights");
  ASSERT_EQ(wide.exit_code, 0) << wide.errors;
  EXPECT_NE(wide.errors.find("MiB fp32"), std::string::npos) << wide.errors;
  EXPECT_EQ(kept.output, wide.output);
  testing::TempDir tmp;
  auto minimum = [&](const std::string& extra) {
    const auto r = run_stratum(gen + extra + " --mem-budget 1K --offload-dir " + tmp.path());
    EXPECT_NE(r.exit_code, 0);
    const auto at = r.errors.find("use --mem-budget ");
    return at == std::string::npos ? 0L : std::stol(r.errors.substr(at + 17));
  };
  EXPECT_LT(minimum(""), minimum(" --fp32-weights"));
}

// OPENBLAS_CORETYPE forced to an older core must not change the GEMM kernels stratum uses.
TEST(Cli, ForcedOpenblasCoretypeIsDropped) {
  const std::string run = std::string(" ") + STRATUM_BINARY + " train --layers 1 --heads 1 --embd 16 --ctx 8 --vocab 101 "
                          "--batch 1 --seq 8 --steps 1 --quiet --data " + kTiny + "/tokens.bin";
  testing::TempDir tmp;
  auto core_of = [&](const std::string& env) {
    const std::string cmd = env + run + " 2>" + tmp.file("err") + " >/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const std::string err = file_read_all(tmp.file("err"));
    const auto pos = err.find("OpenBLAS");
    return pos == std::string::npos ? std::string("?") : err.substr(pos, err.find(',', pos) - pos);
  };
  const std::string native = core_of("env -u OPENBLAS_CORETYPE");
  EXPECT_NE(native, "?");
  EXPECT_EQ(core_of("env OPENBLAS_CORETYPE=Prescott"), native);
  // The escape hatch keeps the user's choice.
  EXPECT_NE(core_of("env OPENBLAS_CORETYPE=Prescott STRATUM_KEEP_OPENBLAS_CORETYPE=1"), native);
}

}  // namespace
}  // namespace stratum
