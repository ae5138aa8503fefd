// Note [jinja subset] (formats/jinja.h) and Note [chat template], [chat mask] (data/chat_template.h):
// the Jinja engine against Jinja2's own renders (tests/golden/chat/renders.json, made by
// tools/make_chat_golden.py with transformers' environment), its one-line refusals, a model
// directory's template and special tokens, the answers a conversation trains, and `prepare
// --jsonl-messages` / `generate --chat` end to end. Does not time anything.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "data/bpe_tokenizer.h"
#include "data/chat_template.h"
#include "data/token_file.h"
#include "formats/jinja.h"
#include "integration_util.h"
#include "stratum/error.h"

namespace stratum {
namespace {

using ojson = nlohmann::ordered_json;
using testing::run_stratum;
using testing::source_path;

const std::string kChatDir = source_path("tests/golden/chat");

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string render(const std::string& source, const ojson& context = ojson::object()) {
  return JinjaTemplate::parse(source, "t").render(context).text;
}

TEST(JinjaTemplate, RendersWhatJinja2RendersForEveryGoldenTemplateAndConversation) {
  const ojson renders = ojson::parse(file_read_all(kChatDir + "/renders.json"));
  ASSERT_GE(renders.size(), 60u);
  int errors = 0;
  for (const ojson& r : renders) {
    const std::string name = r["template"].get<std::string>() + " / " + r["case"].get<std::string>();
    SCOPED_TRACE(name);
    const JinjaTemplate t = JinjaTemplate::parse(file_read_all(kChatDir + "/" + r["template"].get<std::string>()), name);
    if (r.contains("error")) {  // the template's own refusal (raise_exception, messages[0] of no messages)
      ++errors;
      const std::string e = error_of([&] { t.render(r["context"]); });
      EXPECT_EQ(e.rfind("[template] " + name + " line ", 0), 0u) << e;
      const std::string want = r["error"].get<std::string>();
      if (want.rfind("TemplateError: ", 0) == 0) {  // raise_exception's message is passed on
        EXPECT_NE(e.find(want.substr(15)), std::string::npos) << e;
      }
      continue;
    }
    const JinjaTemplate::Rendered got = t.render(r["context"]);
    EXPECT_EQ(got.text, r["text"].get<std::string>());
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    for (const auto& s : r["generation"]) spans.emplace_back(s[0].get<std::size_t>(), s[1].get<std::size_t>());
    EXPECT_EQ(got.generation, spans);
  }
  EXPECT_GE(errors, 5);
}

TEST(JinjaTemplate, WhitespaceControlTrimAndLstripBlocks) {
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("  {% if true %}\nx\n  {% endif %}\ny"), "x\ny");     // lstrip_blocks + trim_blocks
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");               // + keeps the indentation
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");               // + keeps the newline
  EXPECT_EQ(render("a {{ 1 }} {# c #}\nb\n"), "a 1 b");                 // a comment's newline; the final one dropped
  EXPECT_EQ(render("{{ {'a': {'b': 1}}['a']['b'] }}"), "1");              // '}}' inside a dict literal
}

TEST(JinjaTemplate, PythonValueSemantics) {
  const ojson ctx = {{"xs", {3, 1, 2}}, {"d", {{"k", nullptr}}}, {"f", 2.0}};
  EXPECT_EQ(render("{{ xs }} {{ d }} {{ f }} {{ xs[-1] }} {{ d.k is none }} {{ d.missing is defined }}", ctx),
            "[3, 1, 2] {'k': None} 2.0 2 True False");
  EXPECT_EQ(render("{{ 'é✓x'[1] }}{{ 'é✓x' | length }}{{ 'é✓x'[::-1] }}"), "✓3x✓é");
  EXPECT_EQ(render("{{ 10 / 4 }} {{ -7 % 3 }} {{ 2 ** 3 ** 2 }} {{ (1 + 2 * 3) ~ 4 }}"), "2.5 2 64 74");
  EXPECT_EQ(render("{{ (-1) ** 9999999999999 }} {{ 0 ** 0 }} {{ 2 ** 62 }} {{ range(0, 9, 4) | list }}"),
            "-1 1 4611686018427387904 [0, 4, 8]");
  EXPECT_EQ(render("{{ 1e100 }} {{ 123456789012345678.0 }} {{ 0.0001 }} {{ 1/3 }}"),
            "1e+100 1.2345678901234568e+17 0.0001 0.3333333333333333");
  EXPECT_EQ(render("{% set a, b = 1, 'two' %}{{ b }}{{ a }}"), "two1");
  // A for loop's sets stay in the loop; a namespace carries values out.
  EXPECT_EQ(render("{% set x = 0 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "0");
  EXPECT_EQ(render("{% set n = namespace(x=0) %}{% for i in [1, 2] %}{% set n.x = i %}{% endfor %}{{ n.x }}"), "2");
  // |safe marks a string as markup: a plain string joined to it with + is HTML-escaped, as markupsafe does.
  EXPECT_EQ(render("{{ '<b>' | safe + '<i>' }} {{ '<b>' ~ '<i>' }}"), "<b>&lt;i&gt; <b><i>");
  // str.split/rsplit on whitespace with a maximum: the rest is one part, its own whitespace kept (Python's).
  EXPECT_EQ(render("{{ '  a  b  c  '.split(None, 1) }} {{ '  a  b  c  '.rsplit(None, 1) }} {{ ' x y '.rsplit(None, 0) }} "
                   "{{ '   '.split() }}"),
            "['a', 'b  c  '] ['  a  b', 'c'] [' x y'] []");
  EXPECT_EQ(render("{{ strftime_now('%Y') | length }} {{ 'h\u00e9llo'.find('l') }} {{ 'aXbXc'.count('X') }}"), "4 2 2");
}

TEST(JinjaTemplate, RefusesWhatItCannotRenderWithTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{% if x %}", "line 1: the template ends before {% endif %}"},
      {"a\n{{ x | frobnicate }}", "line 2: the filter 'frobnicate' is not supported"},
      {"{% include 'other.jinja' %}", "the statement {% include %} is not supported"},
      {"{{ 'abc }}", "a string without its closing quote"},
      {"{{ x", "a {{ without its }}"},
      {"{% break %}", "{% break %} outside a for loop"},
      {"{{ x is frobbed }}", "the test 'frobbed' is not supported"},
      {"{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}", "nested too deeply"},
      {"{{ f(a=1, 2) }}", "a positional argument after a keyword argument"},
      {"{% generation %}{% generation %}{% endgeneration %}{% endgeneration %}", "a {% generation %} block inside another"}};
  for (const auto& [source, want] : cases) {
    SCOPED_TRACE(source.substr(0, 40));
    const std::string e = error_of([&] { JinjaTemplate::parse(source, "'t.jinja'"); });
    EXPECT_EQ(e.rfind("[template] 't.jinja' line ", 0), 0u) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }
  const std::vector<std::pair<std::string, std::string>> at_render = {
      {"{{ raise_exception('no system role') }}", "line 1: the template raised an error: no system role"},
      {"\n{{ x.y }}", "line 2: the attribute 'y' of an undefined value"},
      {"{{ 'a' + 1 }}", "unsupported operand types for +: 'str' and 'int'"},
      {"{{ 1 // 0 }}", "division by zero"},
      {"{{ 1638400000000000000 * 20 }}", "an integer result of '*' beyond 64 bits"},
      {"{{ 3 ** 40 }}", "an integer result of '**' beyond 64 bits"},
      {"{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "macro calls nested deeper than 8"},
      {"{{ range(200000) | length }}", "a range longer than 100000"},
      {"{{ nothing() }}", "'nothing' is undefined"},
      {"{% set x = 1 %}{% set x.y = 2 %}", "'x' is int, not a namespace()"}};
  for (const auto& [source, want] : at_render) {
    SCOPED_TRACE(source);
    const std::string e = error_of([&] { render(source); });
    EXPECT_EQ(e.rfind("[template] t line ", 0), 0u) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }
}

// A model directory holding `config` as its tokenizer_config.json.
std::string model_dir_with(testing::TempDir& tmp, const std::string& name, const ojson& config) {
  const std::string dir = tmp.file(name);
  std::filesystem::create_directories(dir);
  file_write_atomic(dir + "/tokenizer_config.json", config.dump());
  return dir;
}

const ojson kUser = {{"role", "user"}, {"content", "Hi"}};
const ojson kAnswer = {{"role", "assistant"}, {"content", "Hello!"}};

TEST(ChatTemplate, FoundInTheModelDirectoryWithItsSpecialTokens) {
  testing::TempDir tmp;
  const std::string source = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}"
                             "{% endfor %}{{ pad_token is defined }}";
  const std::string plain = model_dir_with(tmp, "plain", {{"chat_template", source}, {"bos_token", "<s>"},
                                                          {"eos_token", {{"content", "</s>"}, {"lstrip", false}}},
                                                          {"pad_token", nullptr}});
  EXPECT_EQ(ChatTemplate::load(plain).render(ojson::array({kUser}), false), "<s>[user]Hi</s>False");
  const std::string listed = model_dir_with(
      tmp, "listed", {{"chat_template", ojson::array({{{"name", "tool_use"}, {"template", "T"}},
                                                      {{"name", "default"}, {"template", "D{{ messages | length }}"}}})}});
  EXPECT_EQ(ChatTemplate::load(listed).render(ojson::array({kUser}), false), "D1");
  // chat_template.jinja (transformers >= 4.50) comes first; --chat-template FILE before both.
  file_write_atomic(listed + "/chat_template.jinja", "J");
  EXPECT_EQ(ChatTemplate::load(listed).render(ojson::array(), false), "J");
  file_write_atomic(tmp.file("mine.jinja"), "M{{ add_generation_prompt }}");
  EXPECT_EQ(ChatTemplate::load(listed, tmp.file("mine.jinja")).render(ojson::array(), true), "MTrue");
  // apply_chat_template's keyword arguments (Note [chat variables]).
  ChatTemplate think = ChatTemplate::load("", kChatDir + "/think.jinja");
  EXPECT_EQ(think.render(ojson::array({kUser}), true), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  think.set_variables("{\"enable_thinking\": false}", "--chat-vars");
  EXPECT_EQ(think.render(ojson::array({kUser}), true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_NE(error_of([&] { think.set_variables("{enable", "--chat-vars"); }).find("--chat-vars is not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([&] { think.set_variables("[1]", "--chat-vars"); }).find("takes a JSON object"), std::string::npos);
  EXPECT_NE(error_of([&] { think.set_variables("{\"messages\": []}", "--chat-vars"); }).find("set by the renderer itself"),
            std::string::npos);
  const std::string none = model_dir_with(tmp, "base", {{"bos_token", "<s>"}});
  EXPECT_NE(error_of([&] { ChatTemplate::load(none); }).find("has no chat template"), std::string::npos);
  EXPECT_NE(error_of([&] { ChatTemplate::load(none); }).find("--chat-template FILE"), std::string::npos);
  const std::string nodefault = model_dir_with(tmp, "nodefault", {{"chat_template", ojson::array({{{"name", "x"}, {"template", "X"}}})}});
  EXPECT_NE(error_of([&] { ChatTemplate::load(nodefault); }).find("none named \"default\""), std::string::npos);
  EXPECT_NE(error_of([&] { ChatTemplate::load(none, tmp.file("absent.jinja")); }).find("--chat-template file"),
            std::string::npos);
}

// (The special tokens from `dir`'s tokenizer_config.json, when given.)
std::vector<ChatTemplate::Segment> segments_of(const std::string& template_name, const ojson& messages,
                                               const std::string& dir = "", const std::vector<std::string>& special = {}) {
  return ChatTemplate::load(dir, kChatDir + "/" + template_name).segments(messages, nullptr, "'c.jsonl' line 1", special);
}

std::string answers(const std::vector<ChatTemplate::Segment>& segs) {
  std::string out;
  for (const auto& s : segs)
    if (s.target) out += "[" + s.text + "]";
  return out;
}

TEST(ChatTemplate, AnswersAreTheAssistantsTurnsWithTheirEnds) {
  const ojson renders = ojson::parse(file_read_all(kChatDir + "/renders.json"));
  // The answers found by prefixes (chatml.jinja) are the ones Jinja2 marks with {% generation %}
  // in chatml_marked.jinja, which renders the same text.
  int compared = 0;
  for (const ojson& r : renders) {
    if (r["template"] != "chatml.jinja" || r.contains("error") || r["context"]["add_generation_prompt"] == true) continue;
    const ojson& messages = r["context"]["messages"];
    SCOPED_TRACE(r["case"].get<std::string>());
    const auto by_prefix = ChatTemplate::load("", kChatDir + "/chatml.jinja").segments(messages, r["context"]["tools"], "x");
    const auto marked = ChatTemplate::load("", kChatDir + "/chatml_marked.jinja").segments(messages, r["context"]["tools"], "x");
    ASSERT_EQ(by_prefix.size(), marked.size());
    std::string whole;
    for (std::size_t k = 0; k < marked.size(); ++k) {
      EXPECT_EQ(by_prefix[k].text, marked[k].text);
      EXPECT_EQ(by_prefix[k].target, marked[k].target);
      whole += marked[k].text;
    }
    EXPECT_EQ(whole, r["text"].get<std::string>());  // the segments are the whole text, in order
    ++compared;
  }
  EXPECT_GE(compared, 5);
  const ojson two_turns = ojson::array({kUser, kAnswer, {{"role", "user"}, {"content", " More "}},
                                        {{"role", "assistant"}, {"content", "Sure. "}}});
  EXPECT_EQ(answers(segments_of("header.jinja", two_turns)), "[Hello!<|eot_id|>][Sure.<|eot_id|>]");
  // A turn closed by the end-of-text token only at the conversation's end: that token is the last answer's.
  testing::TempDir tmp;
  const std::string eos = model_dir_with(tmp, "eos", {{"eos_token", "</s>"}});
  // The ending "</s>" and the next turn's "<|user|>" share their "<": the answer stops before the
  // special token it would split, and takes in a character of the next turn without the tokenizer's list.
  const std::vector<std::string> special = {"<|user|>", "<|assistant|>", "<|end|>", "</s>"};
  EXPECT_EQ(answers(segments_of("end_eos.jinja", two_turns, eos, special)), "[Hello!<|end|>\n][Sure. <|end|>\n</s>]");
  EXPECT_EQ(answers(segments_of("end_eos.jinja", two_turns, eos)), "[Hello!<|end|>\n<][Sure. <|end|>\n</s>]");
  EXPECT_EQ(answers(segments_of("alternate.jinja", two_turns)), "[Hello!<end_of_turn>\n][Sure.<end_of_turn>\n]");
  // A conversation without an answer has no target; one whose answer holds its reasoning keeps it.
  EXPECT_EQ(answers(segments_of("chatml.jinja", ojson::array({kUser}))), "");
  const ojson thought = {{"role", "assistant"}, {"content", "<think>\nhm\n</think>\n\nFour."}};
  EXPECT_EQ(answers(segments_of("think.jinja", ojson::array({kUser, thought}))), "[<think>\nhm\n</think>\n\nFour.<|im_end|>\n]");
}

TEST(ChatTemplate, ATemplateThatRewritesEarlierTurnsOrRefusesIsNamed) {
  const ojson two_turns = ojson::array({kUser, kAnswer, kUser, kAnswer});
  std::string e = error_of([&] { segments_of("think.jinja", two_turns); });
  EXPECT_NE(e.find("[chat] 'c.jsonl' line 1: the chat template"), std::string::npos) << e;
  EXPECT_NE(e.find("up to message 2 (the assistant's) differently once later messages follow"), std::string::npos) << e;
  EXPECT_NE(e.find("{% generation %}"), std::string::npos) << e;
  e = error_of([&] { segments_of("alternate.jinja", ojson::array({kUser, kUser})); });
  EXPECT_NE(e.find("[chat] 'c.jsonl' line 1: [template] "), std::string::npos) << e;
  EXPECT_NE(e.find("roles must alternate"), std::string::npos) << e;
  e = error_of([&] { segments_of("chatml.jinja", ojson::array({kUser, {{"content", "no role"}}})); });
  EXPECT_NE(e.find("message 2 is not an object with a string \"role\""), std::string::npos) << e;
}

TEST(ChatTemplate, LastOrEachAnswerForTemplatesThatRewriteEarlierTurns) {
  // think.jinja keeps the reasoning of the answers after the last user message only: refused for
  // all answers (above), but the last answer alone splits, and so does each answer as its own example.
  const ojson first = {{"role", "assistant"}, {"content", "<think>\nhm\n</think>\n\nFour."}};
  const ojson second = {{"role", "assistant"}, {"content", "Five."}};
  const ojson conversation = ojson::array({kUser, first, kUser, second});
  const ChatTemplate chat = ChatTemplate::load("", kChatDir + "/think.jinja");
  const auto last = chat.segments(conversation, nullptr, "x", {}, ChatTemplate::Answers::Last);
  EXPECT_EQ(answers(last), "[<think>\n\n</think>\n\nFive.<|im_end|>\n]");
  EXPECT_EQ(last[0].text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nFour.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                          "<|im_start|>assistant\n");  // the earlier answer as the model sees it then: no reasoning
  // prepare --chat-answers each: two examples, each answer trained where it is the last.
  testing::TempDir tmp;
  const std::string dir = model_dir_with(tmp, "m", {{"chat_template", file_read_all(kChatDir + "/think.jinja")}});
  std::filesystem::copy_file(source_path("tests/golden/tokenizer_json/qwen2_style/tokenizer.json"), dir + "/tokenizer.json");
  file_write_atomic(tmp.file("c.jsonl"), ojson{{"messages", conversation}}.dump() + "\n");
  const std::string cmd = "prepare --input " + tmp.file("c.jsonl") + " --jsonl-messages messages --tokenizer " + dir + " --out ";
  const auto all = run_stratum(cmd + tmp.file("all.bin"));
  EXPECT_NE(all.exit_code, 0);
  EXPECT_NE(all.errors.find("--chat-answers each trains each answer as its own example"), std::string::npos) << all.errors;
  const auto each = run_stratum(cmd + tmp.file("each.bin") + " --chat-answers each");
  ASSERT_EQ(each.exit_code, 0) << each.errors;
  const BpeTokenizer tok = BpeTokenizer::load(dir);
  std::vector<std::int32_t> want;
  for (const ojson& example : {ojson::array({kUser, first}), conversation})
    for (const auto& seg : chat.segments(example, nullptr, "x", tok.added_tokens(), ChatTemplate::Answers::Last))
      for (const std::int32_t id : tok.encode(seg.text)) want.push_back(seg.target ? id : token_no_loss(id));
  EXPECT_EQ(token_file_read(tmp.file("each.bin")).tokens, want);
  const auto only_last = run_stratum(cmd + tmp.file("last.bin") + " --chat-answers last");
  ASSERT_EQ(only_last.exit_code, 0) << only_last.errors;
  EXPECT_LT(token_file_read(tmp.file("last.bin")).tokens.size(), want.size());
  // With enable_thinking false the generation prompt holds the empty reasoning block, so the
  // trained answer is the text after it (Note [chat variables]).
  ChatTemplate no_thinking = ChatTemplate::load("", kChatDir + "/think.jinja");
  no_thinking.set_variables("{\"enable_thinking\": false}", "--chat-vars");
  EXPECT_EQ(answers(no_thinking.segments(conversation, nullptr, "x", {}, ChatTemplate::Answers::Last)), "[Five.<|im_end|>\n]");
  const auto vars = run_stratum(cmd + tmp.file("vars.bin") + " --chat-answers last --chat-vars '{\"enable_thinking\": false}'");
  ASSERT_EQ(vars.exit_code, 0) << vars.errors;
  const std::vector<std::int32_t> five = tok.encode("Five.<|im_end|>\n");
  EXPECT_EQ(token_target_count(token_file_read(tmp.file("vars.bin")).tokens.data(), token_file_read(tmp.file("vars.bin")).tokens.size()),
            five.size());
}

// A model directory for the CLI: the qwen2-style test tokenizer (<|im_start|>, <|im_end|> added
// tokens) and chatml.jinja in its tokenizer_config.json.
std::string chat_model_dir(testing::TempDir& tmp) {
  const std::string dir = model_dir_with(tmp, "chatmodel", {{"chat_template", file_read_all(kChatDir + "/chatml.jinja")},
                                                           {"eos_token", "<|im_end|>"}});
  std::filesystem::copy_file(source_path("tests/golden/tokenizer_json/qwen2_style/tokenizer.json"), dir + "/tokenizer.json");
  return dir;
}

TEST(ChatTemplate, PrepareWritesTheConversationsWithTheAnswersAsTargets) {
  testing::TempDir tmp;
  const std::string dir = chat_model_dir(tmp);
  const std::vector<ojson> conversations = {
      ojson::array({kUser, kAnswer}),
      ojson::array({{{"role", "system"}, {"content", "Be brief."}}, kUser, kAnswer,
                    {{"role", "user"}, {"content", "Why, Romeo?"}}, {{"role", "assistant"}, {"content", "Wherefore."}}})};
  {
    std::ofstream out(tmp.file("chat.jsonl"), std::ios::binary);
    for (const ojson& c : conversations) out << ojson{{"id", 1}, {"messages", c}}.dump() << "\n\n";
  }
  const auto r = run_stratum("prepare --input " + tmp.file("chat.jsonl") + " --jsonl-messages messages --threads 2 "
                             "--tokenizer " + dir + " --out " + tmp.file("chat.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.errors;
  const BpeTokenizer tok = BpeTokenizer::load(dir);
  const ChatTemplate chat = ChatTemplate::load(dir);
  std::vector<std::int32_t> want;
  std::size_t targets = 0;
  for (const ojson& c : conversations)
    for (const auto& seg : chat.segments(c, nullptr, "x"))
      for (const std::int32_t id : tok.encode(seg.text)) {
        want.push_back(seg.target ? id : token_no_loss(id));
        targets += seg.target;
      }
  const TokenFileData data = token_file_read(tmp.file("chat.bin"));
  EXPECT_EQ(data.format, TokenFileFormat::MaskedShard);
  EXPECT_EQ(data.tokens, want);
  // Each answer ends with <|im_end|> (a target: the model learns to stop); the prompts' <|im_start|> are not.
  const std::int32_t im_end = tok.token_id("<|im_end|>"), im_start = tok.token_id("<|im_start|>");
  EXPECT_EQ(std::count(data.tokens.begin(), data.tokens.end(), im_end), 3);
  EXPECT_EQ(std::count(data.tokens.begin(), data.tokens.end(), token_no_loss(im_start)), 8);
  EXPECT_NE(r.errors.find("in 2 conversations"), std::string::npos) << r.errors;
  EXPECT_NE(r.errors.find(std::to_string(targets) + " of the tokens are trained, the assistant's answers"),
            std::string::npos) << r.errors;
  // Trained on: the run counts the answers' tokens as its targets.
  const auto train = run_stratum("train --data " + tmp.file("chat.bin") + " --layers 1 --heads 2 --embd 32 --ctx 16 "
                                 "--vocab 664 --batch 1 --seq 8 --steps 2 --threads 1");
  EXPECT_EQ(train.exit_code, 0) << train.errors;
  EXPECT_NE(train.errors.find(std::to_string(targets) + " of them loss targets"), std::string::npos) << train.errors;
}

TEST(ChatTemplate, PrepareRefusesBadConversationsAndFlagsInOneLine) {
  testing::TempDir tmp;
  const std::string dir = chat_model_dir(tmp);
  file_write_atomic(tmp.file("bad.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n{\"msgs\": []}\n");
  file_write_atomic(tmp.file("nolist.jsonl"), "{\"messages\": \"hello\"}\n");
  file_write_atomic(tmp.file("noanswer.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n");
  const std::string base = "prepare --tokenizer " + dir + " --out " + tmp.file("o.bin") + " --input ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {base + tmp.file("bad.jsonl") + " --jsonl-messages messages", "line 2 has no field \"messages\""},
      {base + tmp.file("nolist.jsonl") + " --jsonl-messages messages", "line 1 has a field \"messages\" that is not a list"},
      {base + tmp.file("noanswer.jsonl") + " --jsonl-messages messages", "has no assistant message to train on"},
      {base + tmp.file("bad.jsonl") + " --jsonl-messages messages --jsonl-field text", "leave out --jsonl-field"},
      {base + tmp.file("bad.jsonl") + " --jsonl-messages messages --format raw", "--format raw cannot hold"},
      {base + tmp.file("bad.jsonl") + " --jsonl-field text --chat-template x.jinja", "--chat-template, --chat-answers and --chat-vars are for --jsonl-messages"},
      {base + tmp.file("bad.jsonl") + " --jsonl-messages messages --chat-answers some", "--chat-answers must be all, last or each"},
      {base + tmp.file("bad.jsonl") + " --jsonl-messages messages --chat-template " + tmp.file("none.jinja"),
       "--chat-template file"}};
  for (const auto& [args, want] : cases) {
    SCOPED_TRACE(args);
    const auto r = run_stratum(args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.errors.find(want), std::string::npos) << r.errors;
    EXPECT_FALSE(std::filesystem::exists(tmp.file("o.bin")));
  }
}

// One step of a tiny model (`shape`, 2 heads on one KV head, 32 channels) over the test
// tokenizer's 664 ids, saved under `save` with the tokenizer files (and template) in `dir`.
void train_chat_model(const std::string& dir, const std::string& shape, const std::string& save) {
  const auto trained = run_stratum("train " + shape + " --heads 2 --kv-heads 1 --embd 32 --vocab 664 --untied --data " +
                                   source_path("tests/golden/tiny_qwen2/tokens.bin") + " --batch 1 --seq 8 --steps 1 "
                                   "--threads 1 --tokenizer " + dir + " --save " + save);
  ASSERT_EQ(trained.exit_code, 0) << trained.errors;
}

// Two turns of `generate --model <tmp>/m --interactive` ("Hi", then "Why, Romeo?"; answers of
// `answer` tokens) after the system message of `messages`, whose first turn renders to `prompt`;
// expects turn 2's answer to equal a fresh run over the conversation re-rendered (the turn-1
// answer as its text). Returns turn 1's answer and prompt ids, turn 2's and the run's stderr.
struct Interactive {
  std::vector<std::int32_t> answer1, p1, p2;
  std::string errors;
};
Interactive interactive_two_turns(testing::TempDir& tmp, const std::string& dir, const ojson& messages,
                                  const std::string& prompt, int answer) {
  Interactive out;
  file_write_atomic(tmp.file("in.txt"), "Hi\n\nWhy, Romeo?\n");
  const std::string tokens = " --max-tokens " + std::to_string(answer);
  const auto talk = run_stratum("generate --model " + tmp.file("m") + " --interactive --system 'Be brief.' --temperature 0 "
                                "--no-stop --output-ids --threads 1" + tokens + " < " + tmp.file("in.txt"));
  EXPECT_EQ(talk.exit_code, 0) << talk.errors;
  out.errors = talk.errors;
  const std::size_t nl = talk.output.find('\n');
  if (nl == std::string::npos) {
    ADD_FAILURE() << talk.output;
    return out;
  }
  const std::string turn1 = talk.output.substr(0, nl), turn2 = talk.output.substr(nl + 1);
  EXPECT_EQ(std::count(turn2.begin(), turn2.end(), '\n'), 1) << talk.output;
  const BpeTokenizer tok = BpeTokenizer::load(dir);
  for (std::size_t at = 0; at < turn1.size();) {
    const std::size_t comma = std::min(turn1.find(',', at), turn1.size());
    out.answer1.push_back(std::stoi(turn1.substr(at, comma - at)));
    at = comma + 1;
  }
  EXPECT_EQ(out.answer1.size(), static_cast<std::size_t>(answer));
  ojson conversation = messages;
  conversation.push_back({{"role", "assistant"}, {"content", tok.decode(out.answer1)}});
  conversation.push_back({{"role", "user"}, {"content", "Why, Romeo?"}});
  out.p1 = tok.encode(prompt);
  out.p2 = tok.encode(ChatTemplate::load(dir).render(conversation, true));
  std::string ids2;
  for (const std::int32_t id : out.p2) ids2 += (ids2.empty() ? "" : ",") + std::to_string(id);
  const auto fresh = run_stratum("generate --model " + tmp.file("m") + " --temperature 0 --no-stop --output-ids "
                                 "--threads 1" + tokens + " --prompt-ids " + ids2);
  EXPECT_EQ(fresh.exit_code, 0) << fresh.errors;
  EXPECT_EQ(turn2, fresh.output);
  return out;
}

TEST(ChatTemplate, GenerateChatAnswersTheRenderedConversation) {
  testing::TempDir tmp;
  const std::string dir = chat_model_dir(tmp);
  // A tiny Llama over the test tokenizer's 664 ids, saved with its tokenizer files (and template).
  train_chat_model(dir, "--arch llama --layers 1 --ctx 128", tmp.file("m"));
  ASSERT_TRUE(std::filesystem::exists(tmp.file("m/step-00000001/tokenizer_config.json")));
  const ojson messages = ojson::array({{{"role", "system"}, {"content", "Be brief."}}, kUser});
  const std::string prompt = ChatTemplate::load(dir).render(messages, true);
  std::string ids;
  for (const std::int32_t id : BpeTokenizer::load(dir).encode(prompt)) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string common = "generate --model " + tmp.file("m") + " --temperature 0 --max-tokens 6 --no-stop --output-ids --threads 1 ";
  const auto by_ids = run_stratum(common + "--prompt-ids " + ids);
  const auto by_chat = run_stratum(common + "--chat Hi --system 'Be brief.'");
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.errors;
  ASSERT_EQ(by_chat.exit_code, 0) << by_chat.errors;
  EXPECT_EQ(by_chat.output, by_ids.output);
  // As text, the answer alone is printed (not the rendered prompt).
  const auto text = run_stratum("generate --model " + tmp.file("m") + " --temperature 0 --max-tokens 4 --no-stop --chat Hi --quiet");
  ASSERT_EQ(text.exit_code, 0) << text.errors;
  EXPECT_EQ(text.output.find("<|im_start|>"), std::string::npos) << text.output;
  const auto info = run_stratum("info " + tmp.file("m/step-00000001"));
  EXPECT_NE(info.output.find("chat template: '" + tmp.file("m/step-00000001") + "/tokenizer_config.json' (chat_template)"),
            std::string::npos) << info.output;
  const auto base = run_stratum("info " + source_path("tests/golden/tiny_llama"));
  EXPECT_NE(base.output.find("chat template: none (a base model"), std::string::npos) << base.output;
  // --interactive (Note [next turn]): each stdin line a user message, answered with the conversation
  // so far; turn 2's answer equals a fresh run over the conversation re-rendered (the turn-1 answer
  // as its text), though the decoder read only the tokens that turn added.
  const Interactive talk = interactive_two_turns(tmp, dir, messages, prompt, 5);
  // The KV cache held turn 1's prompt and the 4 answer tokens read back (the 5th ended the turn);
  // turn 2 reads from where its ids part from those.
  std::vector<std::int32_t> held = talk.p1;
  held.insert(held.end(), talk.answer1.begin(), talk.answer1.end() - 1);
  std::size_t shared = 0;
  while (shared < held.size() && shared < talk.p2.size() && held[shared] == talk.p2[shared]) ++shared;
  EXPECT_GT(shared, talk.p1.size() / 2);
  EXPECT_NE(talk.errors.find("prompt: " + std::to_string(talk.p1.size() + talk.p2.size() - shared) + " tokens"),
            std::string::npos)
      << talk.errors << " p1 " << talk.p1.size() << " p2 " << talk.p2.size() << " shared " << shared;
  const auto silent = run_stratum("generate --model " + tmp.file("m") + " --interactive < /dev/null");
  EXPECT_NE(silent.errors.find("stdin ended before a first message"), std::string::npos) << silent.errors;
  const auto mixed = run_stratum("generate --model " + tmp.file("m") + " --interactive --prompt x < /dev/null");
  EXPECT_NE(mixed.errors.find("--interactive reads the user's messages from stdin"), std::string::npos) << mixed.errors;
  const auto refused = run_stratum("generate --model " + tmp.file("m") + " --prompt x --system y");
  EXPECT_NE(refused.errors.find("--system, --chat-template and --chat-vars are for --chat TEXT or --interactive"), std::string::npos)
      << refused.errors;
}

// Note [sliding KV cache]: a chat with a Mistral whose window of 8 keys lets its KV cache keep 520
// positions; turn 1's 600-token answer moves the rows up, and turn 2 continues where the rows
// still hold its window (or reads the conversation again from the start) with a fresh run's answer.
TEST(ChatTemplate, InteractiveChatPastASlidingCachesRowsAnswersAsAFreshRun) {
  testing::TempDir tmp;
  const std::string dir = chat_model_dir(tmp);
  train_chat_model(dir, "--arch mistral --layers 2 --ctx 2048", tmp.file("ckpt"));
  std::filesystem::rename(tmp.file("ckpt/step-00000001"), tmp.file("m"));  // a model directory, its config edited:
  std::filesystem::remove(tmp.file("m/manifest.json"));
  ojson c = ojson::parse(file_read_all(tmp.file("m/config.json")));
  c["sliding_window"] = 8;
  file_write_atomic(tmp.file("m/config.json"), c.dump(2));
  const ojson messages = ojson::array({{{"role", "system"}, {"content", "Be brief."}}, kUser});
  const Interactive talk = interactive_two_turns(tmp, dir, messages, ChatTemplate::load(dir).render(messages, true), 600);
  EXPECT_NE(talk.errors.find("(its sliding layers keep their window's rows"), std::string::npos) << talk.errors;
}

}  // namespace
}  // namespace stratum
