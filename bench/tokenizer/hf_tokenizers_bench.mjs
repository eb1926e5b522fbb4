// The same measurement as tokenizer_bench.cc with @huggingface/tokenizers (the JS port of HF
// tokenizers): node hf_tokenizers_bench.mjs MODEL_DIR TEXT_FILE [SECONDS]. Prints one JSON line.
import { Tokenizer } from '@huggingface/tokenizers';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const [dir, file, secondsArg] = process.argv.slice(2);
const seconds = Number(secondsArg ?? 3);
const text = readFileSync(file, 'utf8');
const docs = text.split('\n\n').filter((d) => d.length > 0);
const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d), 0);
const t0 = performance.now();
const tok = new Tokenizer(JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')),
  JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')));
const loadS = (performance.now() - t0) / 1e3;
const pass = () => docs.reduce((n, d) => n + tok.encode(d, { add_special_tokens: false }).ids.length, 0);
const c0 = performance.now();
const tokens = pass();
const coldS = (performance.now() - c0) / 1e3;
let passes = 0;
const w0 = performance.now();
let warmS = 0;
do {
  pass();
  passes += 1;
  warmS = (performance.now() - w0) / 1e3;
} while (warmS < seconds);
console.log(JSON.stringify({
  impl: '@huggingface/tokenizers', docs: docs.length, bytes, tokens, load_s: +loadS.toFixed(3),
  cold_mb_per_s: +(bytes / coldS / 1e6).toFixed(2), warm_mb_per_s: +(bytes * passes / warmS / 1e6).toFixed(2),
  warm_tokens_per_s: Math.round(tokens * passes / warmS),
}));
