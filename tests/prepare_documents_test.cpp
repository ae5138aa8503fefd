// Note [documents] (data/corpus.h): `stratum prepare --jsonl-field NAME` reads a JSON Lines file's
// records as documents and writes each as the tokenizer's BOS (where its post_processor adds
// one), its ids and an end-of-document token. The reader's records and one-line refusals (with
// line numbers), the end token each tokenizer kind gets, and the CLI's output against the
// tokenizer's own encodings; with --jsonl-prompt (Note [prompt mask]) the prompts' tokens are
// written as no loss targets in a masked shard. Does not time anything.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/file_util.h"
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "data/token_file.h"
#include "integration_util.h"
#include "stratum/error.h"

namespace stratum {
namespace {

using testing::run_stratum;
using testing::shared_data;
using testing::source_path;

std::vector<std::pair<std::size_t, std::string>> records(const std::string& text, const std::string& field = "text") {
  std::vector<std::pair<std::size_t, std::string>> out;
  jsonl_documents(text, field, PromptTemplate(), "'x.jsonl'",
                  [&](std::size_t line, const std::string&, const std::string& doc) { out.emplace_back(line, doc); });
  return out;
}

std::string refusal(const std::string& text, const std::string& field = "text") {
  try {
    records(text, field);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PrepareDocuments, JsonLinesRecordsAreReadInOrderWithTheirLines) {
  const auto got = records("{\"text\": \"first\\nline\", \"id\": 1}\n\n  \r\n{\"id\": 2, \"text\": \"\"}\r\n"
                           "{\"text\": \"caf\\u00e9 <|endoftext|>\"}");
  const std::vector<std::pair<std::size_t, std::string>> want = {
      {1, "first\nline"}, {4, ""}, {5, "caf\xc3\xa9 <|endoftext|>"}};
  EXPECT_EQ(got, want);
  EXPECT_TRUE(records("").empty());
  EXPECT_TRUE(records("\n\n").empty());
  EXPECT_EQ(records("{\"body\": \"x\"}", "body").size(), 1u);
}

TEST(PrepareDocuments, BadRecordsAreRefusedNamingTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"text\": \"a\"}\n{\"text\": \"b\"", "'x.jsonl' line 2 is not valid JSON"},
      {"[1, 2]", "line 1 is a JSON array, not an object with a string field \"text\""},
      {"\n{\"body\": \"a\", \"id\": 3}", "line 2 has no field \"text\" (its fields: \"body\", \"id\")"},
      {"{}", "has no field \"text\" (its fields: none)"},
      {"{\"text\": 17}", "line 1: field \"text\" is 17, not a string"},
      {"{\"text\": null}", "field \"text\" is null, not a string"},
      {"{\"text\": \"a\"} {\"text\": \"b\"}", "line 1 is not valid JSON"},
  };
  for (const auto& [text, fragment] : cases) {
    const std::string message = refusal(text);
    EXPECT_NE(message.find(fragment), std::string::npos) << text << " -> " << message;
    EXPECT_EQ(message.rfind("[prepare] ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

// The end-of-document token of each tokenizer kind, and a given one.
TEST(PrepareDocuments, EachTokenizerEndsDocumentsWithItsEndOfText) {
  const BpeTokenizer gpt2 = BpeTokenizer::load(shared_data(""));
  EXPECT_EQ(document_end_id(gpt2, ""), 50256);
  for (const char* style : {"llama2_style", "llama3_style", "qwen2_style", "metaspace_style"}) {
    const BpeTokenizer tok = BpeTokenizer::load(source_path(std::string("tests/golden/tokenizer_json/") + style));
    const std::int32_t end = document_end_id(tok, "");
    const std::string text = tok.decode_token(end);
    EXPECT_TRUE(text == "<|endoftext|>" || text == "<|end_of_text|>" || text == "</s>") << style << ": " << text;
  }
  EXPECT_EQ(document_end_id(gpt2, "<|endoftext|>"), 50256);
  EXPECT_EQ(document_end_id(gpt2, "!"), gpt2.encode("!")[0]);
  EXPECT_THROW(document_end_id(gpt2, "<|im_end|>"), Error);
}

// encode_each (one cache for a batch of texts) gives each text the ids encode() gives it, for
// every tokenizer kind: byte-level (GPT-2's files; Qwen2's NFC layout), SentencePiece-style
// (Llama 2's; Metaspace prepend_scheme "first", whose first piece of each text differs), with
// empty texts, repeats, special tokens and invalid UTF-8 among them.
TEST(PrepareDocuments, EncodeEachGivesEachTextTheIdsEncodeGivesIt) {
  const std::vector<std::string> texts = {"Hello world", "", "Hello world", " Hello  world\n\nagain", "world Hello",
                                          "<|endoftext|>Hello</s> <s>x", "caf\xc3\xa9 cafe\xcc\x81", "\xff\xfe bad",
                                          "Hello", "  ", "\n"};
  std::vector<std::string> dirs = {shared_data("")};
  for (const char* style : {"llama2_style", "llama3_style", "qwen2_style", "metaspace_style"})
    dirs.push_back(source_path(std::string("tests/golden/tokenizer_json/") + style));
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    const BpeTokenizer tok = BpeTokenizer::load(dir);
    const std::vector<std::string_view> views(texts.begin(), texts.end());
    std::vector<std::size_t> ends;
    const std::vector<std::int32_t> all = tok.encode_each(views, ends);
    ASSERT_EQ(ends.size(), texts.size());
    for (std::size_t k = 0; k < texts.size(); ++k) {
      const std::size_t from = k == 0 ? 0 : ends[k - 1];
      EXPECT_EQ(std::vector<std::int32_t>(all.begin() + static_cast<std::ptrdiff_t>(from),
                                          all.begin() + static_cast<std::ptrdiff_t>(ends[k])),
                tok.encode(texts[k]))
          << "text " << k;
    }
  }
}

// The CLI: each document is BOS (Llama 2's <s>) + its ids + the end token, in file order, the same
// as encoding them one by one; GPT-2's files add no BOS. Bad input writes no file.
TEST(PrepareDocuments, PrepareWritesEachDocumentBetweenItsMarks) {
  testing::TempDir tmp;
  const std::vector<std::string> docs = {"ROMEO: What, art thou hurt?", "", "Second\ndocument\n", "</s> literal"};
  {
    std::ofstream out(tmp.file("docs.jsonl"), std::ios::binary);
    for (const std::string& d : docs) out << nlohmann::json{{"id", 7}, {"text", d}}.dump() << "\n";
  }
  const std::string llama2 = source_path("tests/golden/tokenizer_json/llama2_style");
  for (const std::string& dir : {llama2, shared_data("")}) {
    SCOPED_TRACE(dir);
    const BpeTokenizer tok = BpeTokenizer::load(dir);
    const auto r = run_stratum("prepare --input " + tmp.file("docs.jsonl") + " --jsonl-field text --tokenizer " + dir +
                               " --out " + tmp.file("docs.bin"));
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    EXPECT_NE(r.errors.find("in 4 documents"), std::string::npos) << r.errors;
    std::vector<std::int32_t> want;
    const std::int32_t end = document_end_id(tok, "");
    for (const std::string& d : docs) {
      if (tok.bos_id() >= 0) want.push_back(tok.bos_id());
      for (std::int32_t id : tok.encode(d)) want.push_back(id);
      want.push_back(end);
    }
    EXPECT_EQ(token_file_read(tmp.file("docs.bin")).tokens, want);
    EXPECT_EQ(tok.bos_id() >= 0, dir == llama2) << "Llama 2's post_processor adds <s>; GPT-2's files add none";
  }
  const auto given = run_stratum("prepare --input " + tmp.file("docs.jsonl") + " --jsonl-field text --doc-end '!' "
                                 "--tokenizer " + shared_data("") + " --out " + tmp.file("bang.bin"));
  ASSERT_EQ(given.exit_code, 0) << given.errors;
  EXPECT_EQ(token_file_read(tmp.file("bang.bin")).tokens.back(), BpeTokenizer::load(shared_data("")).encode("!")[0]);

  {
    std::ofstream out(tmp.file("bad.jsonl"), std::ios::binary);
    out << "{\"text\": \"fine\"}\n{\"txt\": \"typo\"}\n";
  }
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--input " + tmp.file("bad.jsonl") + " --jsonl-field text", "line 2 has no field \"text\" (its fields: \"txt\")"},
      {"--input " + tmp.file("docs.jsonl") + " --doc-end '</s>'", "--doc-end is for --jsonl-field NAME"},
      {"--input " + tmp.file("docs.jsonl") + " --jsonl-field text --doc-end '<|im_end|>'",
       "--doc-end '<|im_end|>' is not a token of the tokenizer"},
  };
  // Given to train as it is, a JSON Lines file is refused (it would train on its syntax).
  const auto train = run_stratum("train --data " + tmp.file("docs.jsonl") + " --tokenizer " + shared_data("") +
                                 " --layers 1 --heads 2 --embd 32 --ctx 16 --batch 1 --seq 8 --steps 1 --quiet");
  EXPECT_EQ(train.exit_code, 1);
  EXPECT_NE(train.errors.find("is JSON Lines: tokenize its documents first with 'stratum prepare"), std::string::npos)
      << train.errors;
  for (const auto& [flags, fragment] : refused) {
    const auto r = run_stratum("prepare " + flags + " --tokenizer " + shared_data("") + " --out " + tmp.file("no.bin"));
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_NE(r.errors.find(fragment), std::string::npos) << flags << ": " << r.errors;
    EXPECT_FALSE(std::filesystem::exists(tmp.file("no.bin"))) << flags;
  }
}

// Note [prompt mask]: prompt/completion records are written as BOS + prompt (no loss targets) +
// completion + end (targets), each part encoded alone, in a masked shard that train reads with
// its mask and info describes; bad uses are refused with one line and write nothing.
TEST(PrepareDocuments, PromptsAreWrittenAsNoLossTargets) {
  testing::TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"Q: Who is Romeo?\nA:", " A Montague."}, {"", "No prompt at all."}, {"Say nothing.", ""}};
  {
    std::ofstream out(tmp.file("sft.jsonl"), std::ios::binary);
    for (const auto& [prompt, completion] : pairs)
      out << nlohmann::json{{"prompt", prompt}, {"completion", completion}}.dump() << "\n";
  }
  std::vector<std::tuple<std::size_t, std::string, std::string>> got;
  jsonl_documents(file_read_all(tmp.file("sft.jsonl")), "completion", PromptTemplate::field("prompt"), "'sft.jsonl'",
                  [&](std::size_t line, const std::string& prompt, const std::string& text) {
                    got.emplace_back(line, prompt, text);
                  });
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], std::make_tuple(std::size_t{1}, pairs[0].first, pairs[0].second));
  const std::string llama2 = source_path("tests/golden/tokenizer_json/llama2_style");
  for (const std::string& dir : {llama2, shared_data("")}) {
    SCOPED_TRACE(dir);
    const BpeTokenizer tok = BpeTokenizer::load(dir);
    const auto r = run_stratum("prepare --input " + tmp.file("sft.jsonl") + " --jsonl-prompt prompt --jsonl-field "
                               "completion --threads 2 --tokenizer " + dir + " --out " + tmp.file("sft.bin"));
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    std::vector<std::int32_t> want;
    const std::int32_t end = document_end_id(tok, "");
    std::size_t targets = 0;
    for (const auto& [prompt, completion] : pairs) {
      if (tok.bos_id() >= 0) want.push_back(token_no_loss(tok.bos_id()));
      for (std::int32_t id : tok.encode(prompt)) want.push_back(token_no_loss(id));
      for (std::int32_t id : tok.encode(completion)) want.push_back(id);
      want.push_back(end);
      targets += tok.encode(completion).size() + 1;
    }
    std::vector<std::int32_t> one_by_one;
    for (const auto& [prompt, completion] : pairs) document_encode(tok, completion, end, one_by_one, &prompt);
    EXPECT_EQ(one_by_one, want);
    const TokenFileData data = token_file_read(tmp.file("sft.bin"));
    EXPECT_EQ(data.format, TokenFileFormat::MaskedShard);
    EXPECT_EQ(data.tokens, want);
    EXPECT_NE(r.errors.find("a masked shard: " + std::to_string(targets) + " of the tokens are trained"),
              std::string::npos) << r.errors;
    const auto info = run_stratum("info " + tmp.file("sft.bin"));
    EXPECT_NE(info.output.find("masked-shard, " + std::to_string(want.size()) + " tokens"), std::string::npos)
        << info.output;
    EXPECT_NE(info.output.find(std::to_string(targets) + " of them loss targets"), std::string::npos) << info.output;
  }
  // Trained on with its mask: the run says how many tokens are targets.
  const auto train = run_stratum("train --data " + tmp.file("sft.bin") + " --layers 1 --heads 2 --embd 32 --ctx 16 "
                                 "--batch 1 --seq 8 --steps 2 --threads 1");
  EXPECT_EQ(train.exit_code, 0) << train.errors;
  EXPECT_NE(train.errors.find(" of them loss targets"), std::string::npos) << train.errors;
  // A masked shard of prompts alone (not something prepare writes) is refused by train.
  {
    std::vector<std::int32_t> header(256, 0);
    header[0] = 20261129;
    header[1] = 1;
    header[2] = 3;
    const std::vector<std::uint32_t> ids = {0x80000001u, 0x80000002u, 0x80000003u};
    std::ofstream out(tmp.file("prompts.bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(ids.data()), 12);
  }
  const auto none = run_stratum("train --data " + tmp.file("prompts.bin") + " --layers 1 --heads 2 --embd 32 "
                                "--ctx 16 --batch 1 --seq 2 --steps 1 --threads 1");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.errors.find("its loss mask leaves no token to train on"), std::string::npos) << none.errors;

  const std::string in = "--input " + tmp.file("sft.jsonl");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {in + " --jsonl-prompt prompt", "--jsonl-prompt is for --jsonl-field NAME"},
      {in + " --jsonl-prompt prompt --jsonl-field prompt", "--jsonl-prompt and --jsonl-field both name \"prompt\""},
      {in + " --jsonl-prompt prompt --jsonl-field completion --format llmc", "--format llmc cannot hold the prompt mask"},
      {in + " --jsonl-prompt question --jsonl-field completion",
       "line 1 has no field \"question\" (its fields: \"completion\", \"prompt\"); name the prompt's field with "
       "--jsonl-prompt"},
      {"--input " + tmp.file("sft.bin"), "is a masked token shard, not text"},
  };
  for (const auto& [flags, fragment] : refused) {
    const auto r = run_stratum("prepare " + flags + " --tokenizer " + shared_data("") + " --out " + tmp.file("no.bin"));
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_NE(r.errors.find(fragment), std::string::npos) << flags << ": " << r.errors;
    EXPECT_FALSE(std::filesystem::exists(tmp.file("no.bin"))) << flags;
  }
}

// Note [prompt template]: {name} fields, {{ }} braces and \n \t \\ escapes, each refusal naming
// its character; through the CLI, Alpaca's instruction and input joined into the prompt.
TEST(PrepareDocuments, PromptTemplatesJoinFieldsIntoThePrompt) {
  const PromptTemplate t = PromptTemplate::parse("### Q:\\n{instruction}\\t{{x}}\\\\{input}");
  ASSERT_EQ(t.pieces().size(), 4u);
  EXPECT_FALSE(t.pieces()[0].field);
  EXPECT_EQ(t.pieces()[0].text, "### Q:\n");
  EXPECT_TRUE(t.pieces()[1].field);
  EXPECT_EQ(t.pieces()[1].text, "instruction");
  EXPECT_EQ(t.pieces()[2].text, "\t{x}\\");
  EXPECT_EQ(t.pieces()[3].text, "input");
  EXPECT_EQ(PromptTemplate::parse("no fields").pieces().size(), 1u);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "is empty"}, {"a {b", "a '{' without its '}' at character 3"}, {"a } b", "a '}' without its '{' at character 3"},
      {"{}", "an empty or broken field name at character 1"}, {"{a{b}", "an empty or broken field name"},
      {"x\\q", "an unknown escape at character 2"}, {"x\\", "an unknown escape"}};
  for (const auto& [text, fragment] : bad) {
    try {
      PromptTemplate::parse(text);
      ADD_FAILURE() << text << ": parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << text << ": " << e.what();
    }
  }

  testing::TempDir tmp;
  const std::vector<std::array<std::string, 3>> rows = {
      {"Name a colour.", "", "Red."}, {"Translate to French.", "good night", "Bonne nuit."}};
  {
    std::ofstream out(tmp.file("alpaca.jsonl"), std::ios::binary);
    for (const auto& [instruction, input, output] : rows)
      out << nlohmann::json{{"instruction", instruction}, {"input", input}, {"output", output}}.dump() << "\n";
    out << nlohmann::json{{"instruction", "x"}, {"output", "y"}}.dump() << "\n";
  }
  {
    std::ofstream out(tmp.file("two.jsonl"), std::ios::binary);
    for (const auto& [instruction, input, output] : rows)
      out << nlohmann::json{{"instruction", instruction}, {"input", input}, {"output", output}}.dump() << "\n";
  }
  const std::string tmpl = "'### Instruction:\\n{instruction}\\n\\n### Input:\\n{input}\\n\\n### Response:\\n'";
  const auto r = run_stratum("prepare --input " + tmp.file("two.jsonl") + " --prompt-template " + tmpl +
                             " --jsonl-field output --tokenizer " + shared_data("") + " --out " + tmp.file("a.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const BpeTokenizer tok = BpeTokenizer::load(shared_data(""));
  std::vector<std::int32_t> want;
  for (const auto& [instruction, input, output] : rows) {
    const std::string prompt = "### Instruction:\n" + instruction + "\n\n### Input:\n" + input + "\n\n### Response:\n";
    document_encode(tok, output, 50256, want, &prompt);
  }
  EXPECT_EQ(token_file_read(tmp.file("a.bin")).tokens, want);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--input " + tmp.file("alpaca.jsonl") + " --prompt-template " + tmpl + " --jsonl-field output",
       "line 3 has no field \"input\" (its fields: \"instruction\", \"output\"); name the prompt's fields in "
       "--prompt-template"},
      {"--input " + tmp.file("two.jsonl") + " --prompt-template '{instruction}' --jsonl-prompt input --jsonl-field output",
       "give the prompt as one field (--jsonl-prompt) or as a template (--prompt-template), not both"},
      {"--input " + tmp.file("two.jsonl") + " --prompt-template '{instruction}'",
       "--prompt-template is for --jsonl-field NAME"},
      {"--input " + tmp.file("two.jsonl") + " --prompt-template '{instruction' --jsonl-field output",
       "--prompt-template: a '{' without its '}' at character 1"},
  };
  for (const auto& [flags, fragment] : refused) {
    const auto bad_run = run_stratum("prepare " + flags + " --tokenizer " + shared_data("") + " --out " + tmp.file("no.bin"));
    EXPECT_EQ(bad_run.exit_code, 1) << flags;
    EXPECT_NE(bad_run.errors.find(fragment), std::string::npos) << flags << ": " << bad_run.errors;
    EXPECT_FALSE(std::filesystem::exists(tmp.file("no.bin"))) << flags;
  }
}

// Documents are encoded in batches over a thread pool: 20000 lines of Tiny Shakespeare (three
// batches of at most kJsonlBatchDocuments) give one file for 1 and 3 threads, the ids of encoding
// the documents one by one.
TEST(PrepareDocuments, AnyThreadCountWritesTheSameIds) {
  testing::TempDir tmp;
  const std::string text = file_read_all(shared_data("tinyshakespeare.txt"));
  const BpeTokenizer tok = BpeTokenizer::load(shared_data(""));
  std::vector<std::int32_t> want;
  std::size_t lines = 0;
  {
    std::ofstream out(tmp.file("lines.jsonl"), std::ios::binary);
    for (std::size_t at = 0; lines < 20000 && at < text.size(); ++lines) {
      const std::size_t nl = std::min(text.find('\n', at), text.size());
      const std::string line = text.substr(at, nl - at);
      at = nl + 1;
      out << nlohmann::json{{"text", line}}.dump() << "\n";
      document_encode(tok, line, 50256, want);
    }
  }
  ASSERT_EQ(lines, 20000u);
  ASSERT_GT(lines, 2 * kJsonlBatchDocuments);
  for (const char* threads : {"1", "3"}) {
    const auto r = run_stratum("prepare --input " + tmp.file("lines.jsonl") + " --jsonl-field text --threads " +
                               threads + " --tokenizer " + shared_data("") + " --out " + tmp.file("lines.bin"));
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    EXPECT_EQ(token_file_read(tmp.file("lines.bin")).tokens, want) << threads << " threads";
  }
  const auto r = run_stratum("prepare --input " + tmp.file("lines.jsonl") + " --threads 2 --tokenizer " +
                             shared_data("") + " --out " + tmp.file("text.bin"));
  EXPECT_NE(r.errors.find("--threads is for --jsonl-field or --jsonl-messages"), std::string::npos) << r.errors;
}

}  // namespace
}  // namespace stratum
