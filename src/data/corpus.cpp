// corpus_load_tokens and the documents of a JSON Lines file; see corpus.h.
#include "data/corpus.h"

#include <algorithm>
#include <utility>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "core/printable.h"
#include "core/thread_pool.h"
#include "data/bpe_tokenizer.h"
#include "data/token_file.h"
#include "formats/json_brief.h"
#include "stratum/error.h"

namespace stratum {

std::string corpus_find_tokenizer(const std::string& explicit_dir, const std::string& model_dir) {
  if (!explicit_dir.empty()) return explicit_dir;
  if (model_dir.empty()) return "";
  return BpeTokenizer::files_in(model_dir).empty() ? "" : model_dir;
}

std::vector<std::int32_t> corpus_load_tokens(const std::string& path, const std::string& tokenizer_dir,
                                             int vocab_size, std::string* note) {
  const std::string problem = file_read_problem(path);
  STRATUM_CHECK(problem.empty(), "[data] data file '", path, "' ", problem, "; give a text file or a token file");
  const DataFileReading reading = data_file_reading(path);  // Note [data by content]
  if (note != nullptr) *note = reading.note;
  std::vector<std::int32_t> tokens;
  if (reading.kind != DataFileKind::Text) {
    tokens = token_file_read(path).tokens;
  } else {
    // Note [documents]: JSON Lines read as text would train on its syntax.
    const std::string ext = std::filesystem::path(path).extension().string();
    STRATUM_CHECK(ext != ".jsonl" && ext != ".ndjson", "[data] '", path, "' is JSON Lines: tokenize its documents "
                  "first with 'stratum prepare --input ", path, " --jsonl-field text --tokenizer DIR --out train.bin' "
                  "(naming the field that holds the text; --jsonl-messages messages for conversations) and train on that");
    STRATUM_CHECK(!tokenizer_dir.empty(), "[data] '", path,
                  "' is text: give --tokenizer DIR (encoder.json + vocab.bpe), or tokenize it first with "
                  "'stratum prepare'");
    const std::string text = file_read_all(path);
    STRATUM_CHECK(!text.empty(), "[data] corpus '", path, "' is empty; give a file with some text");
    tokens = BpeTokenizer::load(tokenizer_dir).encode(text);
  }
  STRATUM_CHECK(tokens.size() >= 2, "[data] '", path, "' holds ", tokens.size(),
                " token(s); training needs at least 2");
  STRATUM_CHECK(std::any_of(tokens.begin(), tokens.end(), token_is_target), "[data] '", path,
                "': its loss mask leaves no token to train on (every one is a prompt token); check how it was "
                "prepared (--jsonl-prompt)");
  if (vocab_size > 0) {
    for (std::size_t i = 0; i < tokens.size(); ++i)  // a masked shard's ids under their mark (Note [loss mask])
      STRATUM_CHECK(token_id(tokens[i]) < vocab_size, "[data] '", path, "': token id ", token_id(tokens[i]),
                    " at position ", i, " is outside the model's vocabulary [0, ", vocab_size,
                    "); the data was tokenized for a different model");
  }
  return tokens;
}

namespace {
// Record `j`'s string field `field` (line `line` of `where`); `hint` says which option names it.
const std::string& jsonl_string(const nlohmann::json& j, const std::string& field, const char* hint,
                                const std::string& where, std::size_t line) {
  const auto it = j.find(field);
  if (it == j.end()) {
    std::string fields;
    for (const auto& [key, value] : j.items()) {
      if (fields.size() > 80) {
        fields += ", ...";
        break;
      }
      fields += (fields.empty() ? "\"" : ", \"") + printable_text(key.substr(0, 32)) + "\"";
    }
    STRATUM_FAIL("[prepare] ", where, " line ", line, " has no field \"", field, "\" (its fields: ",
                 fields.empty() ? "none" : fields, "); ", hint);
  }
  STRATUM_CHECK(it->is_string(), "[prepare] ", where, " line ", line, ": field \"", field, "\" is ",
                json_brief(*it), ", not a string");
  return it->get_ref<const std::string&>();
}
}  // namespace

PromptTemplate PromptTemplate::parse(std::string_view text) {
  PromptTemplate t;
  t.flag = "--prompt-template";
  STRATUM_CHECK(!text.empty(), "[prepare] --prompt-template is empty; give the prompt's text with {field} names");
  std::string literal;
  auto bad = [&](std::size_t at, const std::string& what) {
    STRATUM_FAIL("[prepare] --prompt-template: ", what, " at character ", at + 1,
                 "; write {name} for a record's field, {{ and }} for braces, \\n \\t \\\\ for a newline, tab, backslash");
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\') {
      const char e = i + 1 < text.size() ? text[i + 1] : '\0';
      if (e != 'n' && e != 't' && e != '\\') bad(i, "an unknown escape");
      literal += e == 'n' ? '\n' : e == 't' ? '\t' : '\\';
      ++i;
    } else if ((c == '{' || c == '}') && i + 1 < text.size() && text[i + 1] == c) {
      literal += c;
      ++i;
    } else if (c == '{') {
      const std::size_t close = text.find('}', i + 1);
      if (close == std::string_view::npos) bad(i, "a '{' without its '}'");
      const std::string_view name = text.substr(i + 1, close - i - 1);
      if (name.empty() || name.find('{') != std::string_view::npos) bad(i, "an empty or broken field name");
      if (!literal.empty()) t.pieces_.push_back({false, std::exchange(literal, {})});
      t.pieces_.push_back({true, std::string(name)});
      i = close;
    } else if (c == '}') {
      bad(i, "a '}' without its '{'");
    } else {
      literal += c;
    }
  }
  if (!literal.empty()) t.pieces_.push_back({false, literal});
  return t;
}

PromptTemplate PromptTemplate::field(const std::string& name) {
  PromptTemplate t;
  t.flag = "--jsonl-prompt";
  t.pieces_.push_back({true, name});
  return t;
}

template <class Json>
void jsonl_objects(std::string_view text, const std::string& where, const std::string& expected,
                   const std::function<void(std::size_t line, Json& record)>& each) {
  std::size_t line = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view record = text.substr(at, end - at);
    at = end + 1;
    ++line;
    if (record.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank
    Json j;
    try {
      j = Json::parse(record);
    } catch (const nlohmann::json::exception& e) {
      STRATUM_FAIL("[prepare] ", where, " line ", line, " is not valid JSON (", e.what(),
                   "); JSON Lines holds one object per line");
    }
    STRATUM_CHECK(j.is_object(), "[prepare] ", where, " line ", line, " is a JSON ", j.type_name(), ", not ", expected);
    each(line, j);
  }
}
template void jsonl_objects<nlohmann::json>(std::string_view, const std::string&, const std::string&,
                                            const std::function<void(std::size_t, nlohmann::json&)>&);
template void jsonl_objects<nlohmann::ordered_json>(std::string_view, const std::string&, const std::string&,
                                                    const std::function<void(std::size_t, nlohmann::ordered_json&)>&);

void jsonl_documents(std::string_view text, const std::string& field, const PromptTemplate& prompt,
                     const std::string& where,
                     const std::function<void(std::size_t line, const std::string& prompt,
                                              const std::string& document)>& each) {
  std::string made;  // the record's prompt (Note [prompt template])
  const std::string hint = "name the prompt's field" + std::string(prompt.flag == "--jsonl-prompt" ? " with --jsonl-prompt"
                                                                                                : "s in --prompt-template");
  jsonl_objects<nlohmann::json>(text, where, "an object with a string field \"" + field + "\"",
                                [&](std::size_t line, nlohmann::json& j) {
                                  made.clear();
                                  for (const PromptTemplate::Piece& piece : prompt.pieces())
                                    made += piece.field ? jsonl_string(j, piece.text, hint.c_str(), where, line) : piece.text;
                                  each(line, made, jsonl_string(j, field, "name the text's field with --jsonl-field", where, line));
                                });
}

std::int32_t document_end_id(const BpeTokenizer& tokenizer, const std::string& given) {
  if (!given.empty()) {
    const std::int32_t id = tokenizer.token_id(given);
    STRATUM_CHECK(id >= 0, "[prepare] --doc-end '", printable_text(given.substr(0, 48)),
                  "' is not a token of the tokenizer; give one of its special tokens (e.g. <|endoftext|> or </s>)");
    return id;
  }
  for (const char* text : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
    if (const std::int32_t id = tokenizer.token_id(text); id >= 0) return id;
  STRATUM_FAIL("[prepare] the tokenizer has no <|endoftext|>, <|end_of_text|> or </s> to end each document with; "
               "name its end-of-document token with --doc-end TOKEN");
}

namespace {
using Ids = std::vector<std::int32_t>::const_iterator;
// Note [documents]: one document's ids [first, last) as training ids, appended to out; masked:
// after the prompt's ids [prompt_first, prompt_last), the BOS and the prompt as no loss targets
// (Note [prompt mask]).
void document_append(const BpeTokenizer& tokenizer, bool masked, Ids prompt_first, Ids prompt_last, Ids first,
                     Ids last, std::int32_t end, std::vector<std::int32_t>& out) {
  if (const std::int32_t bos = tokenizer.bos_id(); bos >= 0) out.push_back(masked ? token_no_loss(bos) : bos);
  for (Ids it = prompt_first; it != prompt_last; ++it) out.push_back(token_no_loss(*it));
  out.insert(out.end(), first, last);
  out.push_back(end);
}
}  // namespace

void document_encode(const BpeTokenizer& tokenizer, const std::string& document, std::int32_t end,
                     std::vector<std::int32_t>& out, const std::string* prompt) {
  const std::vector<std::int32_t> ids = tokenizer.encode(document);
  const std::vector<std::int32_t> prompt_ids = prompt != nullptr ? tokenizer.encode(*prompt) : std::vector<std::int32_t>{};
  document_append(tokenizer, prompt != nullptr, prompt_ids.begin(), prompt_ids.end(), ids.begin(), ids.end(), end, out);
}

std::size_t jsonl_encode(const BpeTokenizer& tokenizer, std::string_view text, const std::string& field,
                         const PromptTemplate& prompt, const std::string& where, std::int32_t end, ThreadPool& pool,
                         std::vector<std::int32_t>& out) {
  const bool masked = !prompt.empty();
  const std::size_t per = masked ? 2 : 1;  // texts per document: [prompt,] text
  std::vector<std::string> batch;
  std::size_t batch_bytes = 0, documents = 0;
  auto flush = [&] {
    const std::size_t count = batch.size() / per;
    std::vector<std::vector<std::int32_t>> ids(count);
    pool.parallel_for(count, [&](std::size_t d0, std::size_t d1) {
      // One encode call for the range (one cache of pieces): each text's ids as encode() gives them.
      const std::vector<std::string_view> texts(batch.begin() + static_cast<std::ptrdiff_t>(d0 * per),
                                                batch.begin() + static_cast<std::ptrdiff_t>(d1 * per));
      std::vector<std::size_t> ends;
      const std::vector<std::int32_t> all = tokenizer.encode_each(texts, ends);
      auto at = [&](std::size_t k) { return all.begin() + static_cast<std::ptrdiff_t>(k == 0 ? 0 : ends[k - 1]); };
      for (std::size_t d = d0; d < d1; ++d) {
        const std::size_t k = (d - d0) * per;  // the document's first text in the range
        document_append(tokenizer, masked, at(k), at(k + per - 1), at(k + per - 1), at(k + per), end, ids[d]);
      }
    });
    for (const auto& doc : ids) out.insert(out.end(), doc.begin(), doc.end());
    documents += count;
    batch.clear();
    batch_bytes = 0;
  };
  jsonl_documents(text, field, prompt, where,
                  [&](std::size_t, const std::string& made, const std::string& document) {
                    if (masked) batch.push_back(made);
                    batch.push_back(document);
                    batch_bytes += made.size() + document.size();
                    if (batch_bytes >= kJsonlBatchBytes || batch.size() >= kJsonlBatchDocuments * per) flush();
                  });
  flush();
  return documents;
}

}  // namespace stratum
