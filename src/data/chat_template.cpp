// A model's chat template and the conversations it renders; see chat_template.h.
#include "data/chat_template.h"

#include <algorithm>
#include <utility>

#include "core/file_util.h"
#include "core/printable.h"
#include "core/thread_pool.h"
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "data/token_file.h"
#include "stratum/error.h"

namespace stratum {

namespace {
using ojson = nlohmann::ordered_json;

// tokenizer_config.json's "chat_template" entry, or null when it has none (a base model's).
const ojson* config_template(const ojson& config) {
  if (!config.is_object()) return nullptr;
  const auto it = config.find("chat_template");
  return it == config.end() || it->is_null() ? nullptr : &*it;
}

ojson read_json(const std::string& path) {
  try {
    return ojson::parse(file_read_all(path));
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL("[chat] '", path, "' is not valid JSON (", e.what(), "); restore it from the model's files");
  }
}
}  // namespace

ChatTemplate ChatTemplate::load(const std::string& dir, const std::string& file) {
  ChatTemplate chat;
  const std::string config_path = dir + "/tokenizer_config.json";
  const ojson config = !dir.empty() && file_exists(config_path) ? read_json(config_path) : ojson::object();
  if (config.is_object()) {
    // The special tokens transformers passes (its special_tokens_map: the ones that are set).
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
      const auto it = config.find(key);
      if (it == config.end()) continue;
      if (it->is_string()) chat.specials_[key] = *it;
      else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) chat.specials_[key] = (*it)["content"];
    }
    if (const auto it = config.find("additional_special_tokens"); it != config.end() && it->is_array()) {
      ojson names = ojson::array();
      for (const auto& t : *it)
        if (t.is_string()) names.push_back(t);
        else if (t.is_object() && t.contains("content") && t["content"].is_string()) names.push_back(t["content"]);
      chat.specials_["additional_special_tokens"] = names;
    }
  }
  std::string source;
  if (!file.empty()) {
    const std::string problem = file_read_problem(file);
    STRATUM_CHECK(problem.empty(), "[chat] --chat-template file '", file, "' ", problem);
    source = file_read_all(file);
    chat.source_ = "'" + file + "'";
  } else if (!dir.empty() && file_exists(dir + "/chat_template.jinja")) {
    source = file_read_all(dir + "/chat_template.jinja");
    chat.source_ = "'" + dir + "/chat_template.jinja'";
  } else {
    const ojson* it = config_template(config);
    STRATUM_CHECK(it != nullptr, "[chat] '", dir, "' has no chat template (no chat_template.jinja, "
                  "and its tokenizer_config.json has no \"chat_template\"; a base model has none): give one with "
                  "--chat-template FILE");
    if (it->is_string()) {
      source = it->get<std::string>();
    } else {
      STRATUM_CHECK(it->is_array(), "[chat] '", config_path, "': \"chat_template\" is neither a string nor a list of "
                    "{\"name\", \"template\"}; give the template with --chat-template FILE");
      for (const auto& t : *it)
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
          source = t["template"].get<std::string>();
      STRATUM_CHECK(!source.empty(), "[chat] '", config_path, "' lists chat templates but none named \"default\"; "
                    "give the one to use with --chat-template FILE");
    }
    chat.source_ = "'" + config_path + "' (chat_template)";
  }
  chat.template_ = JinjaTemplate::parse(source, chat.source_);
  return chat;
}

void ChatTemplate::set_variables(const std::string& json, const std::string& flag) {
  ojson variables;
  try {
    variables = ojson::parse(json);
  } catch (const nlohmann::json::exception& e) {
    STRATUM_FAIL("[chat] ", flag, " is not valid JSON (", e.what(), "); give an object, e.g. '{\"enable_thinking\": false}'");
  }
  STRATUM_CHECK(variables.is_object(), "[chat] ", flag, " takes a JSON object of the template's variables, e.g. "
                "'{\"enable_thinking\": false}'");
  for (const auto& [name, value] : variables.items()) {
    STRATUM_CHECK(name != "messages" && name != "add_generation_prompt" && name != "tools" && name != "documents",
                  "[chat] ", flag, ": \"", name, "\" is set by the renderer itself; give the template's other variables");
    specials_[name] = value;
  }
}

bool ChatTemplate::exists(const std::string& dir) {
  if (file_exists(dir + "/chat_template.jinja")) return true;
  if (!file_exists(dir + "/tokenizer_config.json")) return false;
  try {
    return config_template(ojson::parse(file_read_all(dir + "/tokenizer_config.json"))) != nullptr;
  } catch (const nlohmann::json::exception&) {
    return true;  // there is a file to read; load() says what is wrong with it
  }
}

JinjaTemplate::Rendered ChatTemplate::rendered(const ojson& messages, bool add_generation_prompt, const ojson& tools) const {
  ojson context = specials_;
  context["messages"] = messages;
  context["tools"] = tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  return template_.render(context);
}

std::string ChatTemplate::render(const ojson& messages, bool add_generation_prompt, const ojson& tools) const {
  return rendered(messages, add_generation_prompt, tools).text;
}

std::vector<ChatTemplate::Segment> ChatTemplate::segments(const ojson& messages, const ojson& tools,
                                                          const std::string& where,
                                                          const std::vector<std::string>& special,
                                                          Answers answers) const {
  STRATUM_CHECK(messages.is_array(), "[chat] ", where, ": the conversation is not a list of messages");
  for (std::size_t i = 0; i < messages.size(); ++i)
    STRATUM_CHECK(messages[i].is_object() && messages[i].contains("role") && messages[i]["role"].is_string(), "[chat] ",
                  where, ": message ", i + 1, " is not an object with a string \"role\" (e.g. {\"role\": \"user\", "
                  "\"content\": \"...\"})");
  try {
    if (answers != Answers::Each) return segments_of(messages, tools, where, special, answers);
    std::vector<Segment> out;  // each answer its own example: the conversation through it, that answer trained
    for (std::size_t i = 0; i < messages.size(); ++i) {
      if (messages[i]["role"] != "assistant") continue;
      const ojson through(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i + 1));
      for (Segment& seg : segments_of(through, tools, where, special, Answers::Last)) out.push_back(std::move(seg));
    }
    return out;
  } catch (const Error& e) {  // the template's own error ("[template] ... line N: ..."), with the conversation's place
    const std::string what = e.what();
    if (what.rfind("[template]", 0) == 0) throw Error("[chat] " + where + ": " + what);
    throw;
  }
}

namespace {
// Where a special token of `text` starts when it covers both sides of `at` (else at).
std::size_t special_start(const std::string& text, std::size_t at, const std::vector<std::string>& special) {
  for (const std::string& s : special)
    for (std::size_t b = at >= s.size() ? at - s.size() + 1 : 0; b < at && b + s.size() > at; ++b)
      if (text.compare(b, s.size(), s) == 0) return b;
  return at;
}
}  // namespace

std::vector<ChatTemplate::Segment> ChatTemplate::segments_of(const ojson& messages, const ojson& tools,
                                                             const std::string& where,
                                                             const std::vector<std::string>& special,
                                                             Answers which) const {
  std::size_t last = messages.size();  // the last assistant message (Note [chat answers])
  for (std::size_t i = 0; i < messages.size(); ++i)
    if (messages[i]["role"] == "assistant") last = i;
  std::vector<std::pair<std::size_t, std::size_t>> answers;
  std::string text;
  if (template_.has_generation()) {
    JinjaTemplate::Rendered r = rendered(messages, false, tools);
    text = std::move(r.text);
    answers = std::move(r.generation);
    if (which == Answers::Last && answers.size() > 1) answers.erase(answers.begin(), answers.end() - 1);
  } else {
    text = render(messages, false, tools);
    for (std::size_t i = 0; i < messages.size(); ++i) {
      if (messages[i]["role"] != "assistant" || (which == Answers::Last && i != last)) continue;
      const ojson before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
      const ojson through(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i + 1));
      const std::string prompt = render(before, true, tools);
      const std::string turn = render(through, false, tools);
      std::size_t agree = 0;  // how far the conversation up to this answer agrees with the whole one
      while (agree < turn.size() && agree < text.size() && turn[agree] == text[agree]) ++agree;
      for (std::size_t was = agree + 1; was != agree;) {  // not into a special token either text goes on with
        was = agree;
        agree = std::min(special_start(text, agree, special), special_start(turn, agree, special));
      }
      STRATUM_CHECK(text.compare(0, prompt.size(), prompt) == 0 && agree > prompt.size(), "[chat] ", where,
                    ": the chat template ", source_, " renders the conversation up to message ", i + 1,
                    " (the assistant's) differently once later messages follow, so that answer's text cannot be "
                    "told apart (Note [chat mask]); --chat-answers each trains each answer as its own example (or "
                    "last, the last alone), or give a template that marks answers with {% generation %} "
                    "(--chat-template FILE)");
      answers.emplace_back(prompt.size(), agree);
    }
  }
  std::vector<Segment> out;
  std::size_t at = 0;
  for (const auto& [begin, end] : answers) {
    STRATUM_CHECK(begin >= at && end >= begin && end <= text.size(), "[chat] ", where, ": the chat template ", source_,
                  " renders an answer that begins inside the one before it; give a template that marks answers with "
                  "{% generation %} (--chat-template FILE)");
    if (begin > at) out.push_back({text.substr(at, begin - at), false});
    if (end > begin) out.push_back({text.substr(begin, end - begin), true});
    at = end;
  }
  if (at < text.size()) out.push_back({text.substr(at), false});
  return out;
}

std::size_t chat_jsonl_encode(const BpeTokenizer& tokenizer, const ChatTemplate& chat, std::string_view text,
                              const std::string& field, const std::string& where, ThreadPool& pool,
                              std::vector<std::int32_t>& out, ChatTemplate::Answers answers) {
  struct Record {
    std::size_t line;
    ojson messages, tools;
  };
  std::vector<Record> batch;
  constexpr std::size_t kChatBatch = 4096;  // conversations rendered and encoded together over the pool
  std::size_t conversations = 0;
  const std::vector<std::string> special = tokenizer.added_tokens();
  auto flush = [&] {
    std::vector<std::vector<std::int32_t>> ids(batch.size());
    std::vector<std::string> errors(batch.size());  // the first record's error is reported, whichever thread met it
    pool.parallel_for(batch.size(), [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {
        std::vector<ChatTemplate::Segment> segs;
        try {
          segs = chat.segments(batch[r].messages, batch[r].tools, where + " line " + std::to_string(batch[r].line),
                               special, answers);
        } catch (const Error& e) {
          errors[r] = e.what();
          continue;
        }
        std::vector<std::string_view> texts;
        for (const auto& s : segs) texts.push_back(s.text);
        std::vector<std::size_t> ends;
        const std::vector<std::int32_t> all = tokenizer.encode_each(texts, ends);
        for (std::size_t k = 0, from = 0; k < segs.size(); from = ends[k], ++k)
          for (std::size_t t = from; t < ends[k]; ++t) ids[r].push_back(segs[k].target ? all[t] : token_no_loss(all[t]));
      }
    });
    for (const std::string& e : errors)
      if (!e.empty()) throw Error(e);
    for (const auto& conv : ids) out.insert(out.end(), conv.begin(), conv.end());
    conversations += batch.size();
    batch.clear();
  };
  jsonl_objects<ojson>(text, where, "an object with a list of messages \"" + field + "\"", [&](std::size_t line, ojson& j) {
    const auto it = j.find(field);
    STRATUM_CHECK(it != j.end() && it->is_array(), "[prepare] ", where, " line ", line,
                  it == j.end() ? " has no field \"" : " has a field \"", printable_text(field.substr(0, 48)), "\"",
                  it == j.end() ? "" : " that is not a list", "; --jsonl-messages names the field holding the "
                  "conversation's list of {\"role\", \"content\"} messages");
    const auto tools = j.find("tools");
    batch.push_back({line, std::move(*it), tools != j.end() ? *tools : ojson(nullptr)});
    if (batch.size() >= kChatBatch) flush();
  });
  flush();
  return conversations;
}

}  // namespace stratum
