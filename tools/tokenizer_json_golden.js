// Writes the tokenizer.json golden files with Hugging Face's own tokenizers library (the npm
// package `tokenizers`: Node bindings of the Rust crate that transformers uses):
//   tests/golden/tokenizer_json/llama3_style/tokenizer.json  a small Llama-3-style tokenizer
//   tests/golden/tokenizer_json/golden.json                   texts and the ids HF gives them
// The Llama-3-style tokenizer has Llama 3's Split regex + ByteLevel (use_regex false), the 256
// byte tokens, 400 merges learned here from tinyshakespeare (most frequent pair, ties broken by
// the smaller pair), a few whole words with no merge path (they exercise ignore_merges: true),
// merges as ["a", "b"] pairs, Llama 3's special tokens after the vocabulary and its BOS
// TemplateProcessing, plus three made-up added tokens that exercise longest-first matching
// ("<|end"), the second matching pass of "normalized": true tokens ("QQ<|eot") and a
// non-special token with a space (" Capulet").
//   tests/golden/tokenizer_json/qwen2_style/tokenizer.json   the same vocabulary and merges as
//     Qwen2 ships its tokenizer: an NFC normalizer, Qwen2's Split regex (single digits),
//     ignore_merges false, and its three special tokens.
// The GPT-2 tokenizer.json is built from encoder.json + vocab.bpe exactly as the C++ test builds
// it (gpt2_tokenizer_json in tests/bpe_tokenizer_json_test.cpp) and is not written (1.3 MB):
// only its ids are. Does not install anything: run it through tools/make_tokenizer_json_golden.sh.
//   tests/golden/tokenizer_json/llama2_style/tokenizer.json  a SentencePiece-style BPE tokenizer
//     (byte fallback, "\u2581" spaces) as Hugging Face writes Llama 2's, TinyLlama's and Mistral
//     7B v0.1's: made from a real sentencepiece model by tools/make_sp_tokenizer_json.py (the
//     folder named by the third argument); copied here unchanged.
//   tests/golden/tokenizer_json/metaspace_style/tokenizer.json  the same model as transformers
//     writes it with legacy=False: no normalizer and a Metaspace pre-tokenizer (prepend_scheme
//     "first", split false); the same decoder. Its ids are also decoded with a Metaspace decoder
//     (section metaspace_decoder), which some Hub files have.
// Usage: node tokenizer_json_golden.js <shared data dir> <output dir> <sentencepiece dir>
'use strict';
const fs = require('fs');
const path = require('path');
const assert = require('assert');
const { Tokenizer } = require('tokenizers');

const [dataDir, outDir, spDir] = process.argv.slice(2);
if (!dataDir || !outDir || !spDir) throw new Error('usage: node tokenizer_json_golden.js <shared data dir> <output dir> <sentencepiece dir>');

const LLAMA3_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const NUM_MERGES = 400;

// GPT-2's bytes_to_unicode(): byte value -> one-character string.
function bytesToUnicode() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  }
  const table = new Array(256);
  bs.forEach((b, i) => { table[b] = String.fromCodePoint(cs[i]); });
  return table;
}
const BYTE_CHARS = bytesToUnicode();

function addedToken(id, content, special, normalized) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized, special };
}

// The Hugging Face GPT-2 tokenizer.json (as on the Hub), from the OpenAI files.
function gpt2TokenizerJson(addPrefixSpace) {
  const vocab = JSON.parse(fs.readFileSync(path.join(dataDir, 'encoder.json'), 'utf8'));
  const merges = fs.readFileSync(path.join(dataDir, 'vocab.bpe'), 'utf8').split('\n')
    .filter((line, i) => line !== '' && !(i === 0 && line.startsWith('#version')));
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [addedToken(50256, '<|endoftext|>', true, true)],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: addPrefixSpace, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges,
    },
  };
}

function llamaTokenizerJson(vocab, merges, added, ignoreMerges) {
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: LLAMA3_REGEX }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ] },
    post_processor: { type: 'Sequence', processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      { type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
               { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [added[0].id], tokens: ['<|begin_of_text|>'] } } },
    ] },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: ignoreMerges, vocab, merges,
    },
  };
}

// Qwen2's tokenizer.json layout (Qwen2.5's, its vocabulary and merges replaced): NFC, its regex,
// ByteLevel without a regex, no ignore_merges, a ByteLevel post_processor that adds nothing.
function qwen2TokenizerJson(vocab, merges, added, normalizer) {
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: added,
    normalizer,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: QWEN2_REGEX }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    ] },
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges,
    },
  };
}

// Learns `count` merges over the pre-tokens of `text` (byte-level strings).
function learnMerges(text, count) {
  const byteVocab = {};
  BYTE_CHARS.forEach((c, b) => { byteVocab[c] = b; });
  const splitter = Tokenizer.fromString(JSON.stringify(llamaTokenizerJson(byteVocab, [], [addedToken(256, '<|begin_of_text|>', true, false)], false)));
  const freq = new Map();
  for (const [piece] of splitter.getPreTokenizer().preTokenizeString(text)) freq.set(piece, (freq.get(piece) || 0) + 1);
  const words = [...freq.entries()].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0))
    .map(([piece, n]) => ({ symbols: Array.from(piece), n }));
  const merges = [];
  for (let m = 0; m < count; m++) {
    const pairs = new Map();
    for (const w of words) {
      for (let i = 0; i + 1 < w.symbols.length; i++) {
        const key = w.symbols[i] + '\u0000' + w.symbols[i + 1];
        pairs.set(key, (pairs.get(key) || 0) + w.n);
      }
    }
    let best = null, bestN = 0;
    for (const [key, n] of pairs) {
      if (n > bestN || (n === bestN && key < best)) { best = key; bestN = n; }
    }
    if (best === null) break;
    const [a, b] = best.split('\u0000');
    merges.push([a, b]);
    for (const w of words) {
      const out = [];
      for (let i = 0; i < w.symbols.length;) {
        if (i + 1 < w.symbols.length && w.symbols[i] === a && w.symbols[i + 1] === b) { out.push(a + b); i += 2; }
        else out.push(w.symbols[i++]);
      }
      w.symbols = out;
    }
  }
  return merges;
}

function byteLevel(s) {
  return Array.from(Buffer.from(s, 'utf8')).map(b => BYTE_CHARS[b]).join('');
}

async function encodeAll(tokenizer, texts, roundTrip) {
  const cases = [];
  for (const text of texts) {
    const ids = (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds();
    assert(ids.every(Number.isInteger), `non-integer id for ${JSON.stringify(text)}`);
    if (roundTrip) {
      assert.strictEqual(await tokenizer.decode(ids, false), text, `HF does not round-trip ${JSON.stringify(text)}`);
    }
    cases.push({ text, ids });
  }
  return cases;
}

async function main() {
  const shakespeare = fs.readFileSync(path.join(dataDir, 'tinyshakespeare.txt'), 'utf8');

  // --- The Llama-3-style tokenizer.
  const merges = learnMerges(shakespeare, NUM_MERGES);
  assert.strictEqual(merges.length, NUM_MERGES);
  const vocab = {};
  BYTE_CHARS.forEach((c, b) => { vocab[c] = b; });
  let next = 256;
  for (const [a, b] of merges) if (!(a + b in vocab)) vocab[a + b] = next++;
  const plain = Tokenizer.fromString(JSON.stringify(llamaTokenizerJson(vocab, merges, [addedToken(next, '<|begin_of_text|>', true, false)], false)));
  // Whole words that the merges split: reachable only through ignore_merges.
  const wholeWords = [];
  for (const word of [' Romeo', ' Juliet', ' Montague', ' Capulets', ' Shakespeare']) {
    const ids = (await plain.encode(word, null, { addSpecialTokens: false })).getIds();
    if (ids.length > 1) { vocab[byteLevel(word)] = next++; wholeWords.push(word); }
  }
  assert(wholeWords.length >= 2, `too few whole words need ignore_merges: ${wholeWords}`);
  const added = [
    addedToken(next, '<|begin_of_text|>', true, false),
    addedToken(next + 1, '<|end_of_text|>', true, false),
    addedToken(next + 2, '<|eot_id|>', true, false),
    addedToken(next + 3, '<|end', true, false),
    addedToken(next + 4, 'QQ<|eot', false, true),
    addedToken(next + 5, ' Capulet', false, false),
  ];
  const llamaJson = llamaTokenizerJson(vocab, merges, added, true);
  const llama = Tokenizer.fromString(JSON.stringify(llamaJson));
  assert.strictEqual(llama.getVocabSize(true), next + added.length);

  const texts = [
    // Empty and trivial.
    '', 'a', ' ', '\n', 'Hello', 'Hello world', ' Hello world',
    // English prose.
    'The quick brown fox jumps over the lazy dog.',
    'It was the best of times, it was the worst of times, it was the age of wisdom.',
    'CamelCaseIdentifier snake_case_name SCREAMING_CASE_NAME mixedUP lowercase',
    // Contractions in every case (Llama 3 matches them case-insensitively, GPT-2 only lower).
    "I'm sure it's fine; we'll see. They've gone, you'd know, I'd've, don't can't won't.",
    "I'LL IT'S HE'S SHE'LL WE'RE THEY'VE I'M YOU'D JOHN'S You'Re We'Ll iT's",
    "'s 't 're 've 'm 'll 'd 'x ''s ''' 'S 'T 'RE 'VE 'M 'LL 'D",
    "it'\u017f long s (folds to s)",
    'It\u2019s the dog\u2019s bone, isn\u2019t it?',
    // Digits: Llama 3 splits runs into groups of three.
    '0 1 12 123 1234 12345 123456 1234567', '1234567', '12345678901234567890',
    'Pi is 3.14159265358979, e is 2.718281828, and 2024-01-31 was a Wednesday.',
    '$1,000,000.00 and 99.5% of 1e-10 or 0x1F3A; call +1 (555) 010-9999.',
    'abc123def 4th 21st 1990s v2.0.1',
    // Whitespace runs: spaces, tabs, newlines, CR, trailing spaces.
    '   leading spaces', 'trailing spaces   ', 'a  b   c    d     e',
    'tabs\there\t\tand\t\t\tthere\t', 'line1\nline2\n\nline4\n\n\n',
    'windows\r\nline endings\r\n\r\n', '   \n\n   \t \t  ', '\t\t\t', '\n\n\n\n',
    'indent:\n    four\n        eight\n\tone tab\n', 'ends with space ', 'x \n y', 'a \n\n b', '.\n\n\nx',
    '\u000b vertical tab \u000c form feed', 'no\u00a0break\u00a0space and em\u2003space',
    'x\u00a0\u00a0y \u00a0z a \u3000b ideographic\u3000\u3000space\u3000', 'tab\t\u00a0 \u2003\u2003end',
    'next\u0085line and bom\ufeffhere',
    // Punctuation runs.
    '!!!???...', 'Wait... what?! No way!!!', '--- *** === ___ ~~~', '(a) [b] {c} <d> "e" `f`',
    '@#$%^&*()_+-=[]{}|;:,.<>/?', ',,,,,,,,', '"Quoted," she said. \'Single.\'', 'a.b,c;d:e!f?g',
    'end.\n\nNext', 'x!\r\n\r\ny',
    // Code.
    'def foo(x):\n    return x ** 2  # square\n',
    'for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n',
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    'https://example.com/path/to/page?q=1&r=two#frag user@example.com',
    // Special and added tokens inside text.
    '<|endoftext|>', 'Hello<|endoftext|>World', '<|endoftext|> <|endoftext|>\n<|endoftext|>',
    '<|begin_of_text|>Hello world<|eot_id|>', '<|eot_id|><|eot_id|>', 'x<|end_of_text|>y',
    '<|end_of_text', '<|endx <|end_of_text|> <|end', 'QQ<|eot_id|> QQ<|eotx QQ<|eot',
    'Lady Capulet and the Capulets', ' Capulet', 'Romeo and Juliet, a Montague and Capulets; ROMEO: Romeo!',
    '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>',
    // Unicode: accents, other scripts, CJK, emoji, symbols.
    'caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade \u00fcber Stra\u00dfe',
    'cafe\u0301 nai\u0308ve n\u0303 a\u030a combining marks',
    // NFC's other moves: singletons (Angstrom and Ohm signs), reordered marks, Hangul jamo.
    '\u212b \u2126 A\u030a\u0301 e\u0301\u0301 \u1e9b\u0323 q\u0323\u0307 \u1100\u1161\u11a8 \u0344',
    'Re\u0301sume\u0301: the Cafe\u0301 of \u212bngstr\u00f6m<|im_end|>na\u0308',
    '<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|><|endoftext|>',
    '\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b5\u03af\u03bc\u03b5\u03bd\u03bf',
    '\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?',
    '\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002',
    '\u4e2d\u6587\u5b57\u7b26\u6d4b\u8bd5\uff0c\u4f60\u597d\u4e16\u754c\uff01',
    '\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8',
    '\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645',
    '\u0939\u093f\u0928\u094d\u0926\u0940 \u092a\u093e\u0920',
    '\ud83d\ude00\ud83d\udc4d\ud83c\udffd\ud83c\udf89 \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66 \u2764\ufe0f',
    'emoji\ud83d\ude80inside words\ud83c\udf0dand \ud83c\uddeb\ud83c\uddf7 flags',
    '\uff11\uff12\uff13 \uff21\uff22\uff23 fullwidth', '\u00bd \u00b2 \u2167 \u0663\u0664\u0665\u0666 numbers of other kinds',
    '\u20ac100 \u00a350 \u00a5300 \u00a9 \u00ae \u2122 \u00b0C', '\u00df \u1e9e \ufb01 \u0133 \u00c6\u00e6 \u0152\u0153',
    // Repetition and control characters.
    'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'hahahahahahahahaha', 'the the the the the',
    'nul\u0000byte \u0001\u0002 del\u007f esc\u001b[0m',
    // Shakespeare.
    shakespeare.slice(0, 700), shakespeare.slice(100000, 100400),
  ];
  for (const text of texts) assert(!/[\ud800-\udfff]/u.test(text), 'lone surrogate in a golden text');

  // --- The Qwen2-style tokenizer: the same vocabulary and merges (whole words included), NFC.
  const qwenAdded = [
    addedToken(next, '<|endoftext|>', true, false),
    addedToken(next + 1, '<|im_start|>', true, false),
    addedToken(next + 2, '<|im_end|>', true, false),
  ];
  const qwen2Json = qwen2TokenizerJson(vocab, merges, qwenAdded, { type: 'NFC' });
  const qwen2 = Tokenizer.fromString(JSON.stringify(qwen2Json));
  const qwen2Raw = Tokenizer.fromString(JSON.stringify(qwen2TokenizerJson(vocab, merges, qwenAdded, null)));

  // --- The SentencePiece-style tokenizers: Llama 2's layout and transformers' legacy=False one.
  const llama2Json = JSON.parse(fs.readFileSync(path.join(spDir, 'tokenizer.json'), 'utf8'));
  const metaspaceJson = JSON.parse(JSON.stringify(llama2Json));
  metaspaceJson.normalizer = null;
  metaspaceJson.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false };
  const metaspaceSplitJson = JSON.parse(JSON.stringify(metaspaceJson));
  metaspaceSplitJson.pre_tokenizer.split = true;
  metaspaceSplitJson.pre_tokenizer.prepend_scheme = 'always';
  // Transformers' and Mistral's other decoder: Metaspace, which drops the first token's "\u2581"s.
  const metaspaceDecoderJson = JSON.parse(JSON.stringify(metaspaceJson));
  metaspaceDecoderJson.decoder = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false };
  const spTexts = texts.concat(['<s>Hello</s> world', 'a<s> b </s>c<unk>', ' <s>', '\u2581already \u2581\u2581marked\u2581']);

  const cases = {
    llama3_style: await encodeAll(llama, texts, true),
    qwen2_style: await encodeAll(qwen2, texts, false),
    gpt2: await encodeAll(Tokenizer.fromString(JSON.stringify(gpt2TokenizerJson(false))), texts, true),
    gpt2_prefix_space: await encodeAll(Tokenizer.fromString(JSON.stringify(gpt2TokenizerJson(true))), texts, false),
    llama2_style: await encodeAll(Tokenizer.fromString(JSON.stringify(llama2Json)), spTexts, false),
    metaspace_style: await encodeAll(Tokenizer.fromString(JSON.stringify(metaspaceJson)), spTexts, false),
    metaspace_split_always: await encodeAll(Tokenizer.fromString(JSON.stringify(metaspaceSplitJson)), spTexts, false),
    metaspace_decoder: await encodeAll(Tokenizer.fromString(JSON.stringify(metaspaceDecoderJson)), spTexts, false),
  };
  // What Hugging Face's decoders give back (decode(ids), special tokens kept), for decode().
  for (const [name, json] of [['llama2_style', llama2Json], ['metaspace_style', metaspaceJson],
                              ['metaspace_decoder', metaspaceDecoderJson]]) {
    const tokenizer = Tokenizer.fromString(JSON.stringify(json));
    for (const c of cases[name]) c.decoded = await tokenizer.decode(c.ids, false);
  }
  fs.writeFileSync(path.join(spDir, 'texts.json'), JSON.stringify(spTexts));
  // The golden texts must exercise what they are meant to: ignore_merges changes some ids.
  const withMerges = Tokenizer.fromString(JSON.stringify(llamaTokenizerJson(vocab, merges, added, false)));
  const differ = (await encodeAll(withMerges, texts, true)).filter((c, i) => c.ids.join() !== cases.llama3_style[i].ids.join());
  assert(differ.length > 0, 'no golden text depends on ignore_merges');

  // NFC changes what the golden texts encode to: the normalizer is exercised.
  const nfcMoves = (await encodeAll(qwen2Raw, texts, false)).filter((c, i) => c.ids.join() !== cases.qwen2_style[i].ids.join());
  assert(nfcMoves.length >= 3, `NFC changes only ${nfcMoves.length} golden texts`);

  fs.mkdirSync(path.join(outDir, 'llama3_style'), { recursive: true });
  fs.writeFileSync(path.join(outDir, 'llama3_style', 'tokenizer.json'), JSON.stringify(llamaJson, null, 1) + '\n');
  for (const [name, json] of [['llama2_style', llama2Json], ['metaspace_style', metaspaceJson]]) {
    fs.mkdirSync(path.join(outDir, name), { recursive: true });
    fs.writeFileSync(path.join(outDir, name, 'tokenizer.json'), JSON.stringify(json, null, 1) + '\n');
  }
  fs.mkdirSync(path.join(outDir, 'qwen2_style'), { recursive: true });
  fs.writeFileSync(path.join(outDir, 'qwen2_style', 'tokenizer.json'), JSON.stringify(qwen2Json, null, 1) + '\n');
  const sections = Object.entries(cases).map(([name, list]) =>
    `"${name}": [\n` + list.map(c => JSON.stringify(c)).join(',\n') + '\n]');
  const header = `"generator": ${JSON.stringify(`tools/make_tokenizer_json_golden.sh (npm tokenizers ${require('tokenizers/package.json').version})`)}`;
  fs.writeFileSync(path.join(outDir, 'golden.json'), '{' + header + ',\n' + sections.join(',\n') + '\n}\n');
  console.log(`[tokenizer_json_golden] ${texts.length} texts x ${Object.keys(cases).length} tokenizers; ` +
    `llama3_style: ${next} vocabulary tokens (whole words: ${wholeWords.join(',')}), ${merges.length} merges, ` +
    `${added.length} added tokens; ignore_merges changes ${differ.length} texts; NFC changes ${nfcMoves.length} ` +
    `(qwen2_style); wrote ${outDir}`);
}

main().catch(e => { console.error(e); process.exit(1); });
