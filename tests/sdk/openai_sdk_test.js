// VAMP's OpenAI API through the official `openai` npm SDK, against a live vamp-controller with a
// CPU agent serving tests/data/tiny-qwen3-vocab (Qwen3's tokenizer and chat template, dummy
// weights: real text, meaningless content). run_openai_sdk_test.sh starts the controller and runs
// this file with node's test runner; VAMP_BASE_URL is the controller's HTTP address.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const OpenAI = require('openai');

const baseURL = process.env.VAMP_BASE_URL;
const client = new OpenAI({baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0});
const MODEL = 'tiny-qwen3-vocab';
const messages = [{role: 'user', content: 'Tell me a story about a robot 🤖'}];
const noThinking = {chat_template_kwargs: {enable_thinking: false}};

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// Per choice index: the streamed text (completions) or content (chat), and its finish_reason.
function byIndex(chunks, chat) {
  const out = {};
  for (const chunk of chunks) {
    for (const c of chunk.choices) {
      const o = (out[c.index] ??= {text: '', finish_reason: null});
      o.text += chat ? (c.delta.reasoning_content ?? '') + (c.delta.content ?? '') : c.text;
      if (c.finish_reason) o.finish_reason = c.finish_reason;
    }
  }
  return out;
}

// A counter or gauge from /metrics, summed over the series whose labels include `labels`.
async function metric(name, labels = {}) {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n')) {
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$/);
    if (!m || m[1] !== name) continue;
    const got = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map(x => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => got[k] === v)) sum += Number(m[3]);
  }
  return sum;
}

async function waitFor(predicate, what, timeoutMs = 10000) {
  const end = Date.now() + timeoutMs;
  while (!(await predicate())) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise(r => setTimeout(r, 50));
  }
}

async function expect400(promise, param) {
  await assert.rejects(promise, err => {
    assert.ok(err instanceof OpenAI.BadRequestError, `${err}`);
    assert.equal(err.status, 400);
    assert.equal(err.param, param, JSON.stringify(err.error));
    return true;
  });
}

// 32 greedy tokens of the prompt (EOS ignored): the reference text the stop tests cut.
async function greedy(chat) {
  if (chat) {
    const r = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 32, temperature: 0, ignore_eos: true, ...noThinking});
    return r.choices[0].message.content;
  }
  const r = await client.completions.create({
    model: MODEL, prompt: 'Once upon a time', max_tokens: 32, temperature: 0, ignore_eos: true});
  return r.choices[0].text;
}

// A stop string from the middle of `text` (whole characters) and the text before its first match.
function stopFrom(text) {
  const chars = Array.from(text);
  assert.ok(chars.length >= 12, `greedy text too short: ${JSON.stringify(text)}`);
  const stop = chars.slice(8, 11).join('');
  return {stop, before: text.slice(0, text.indexOf(stop))};
}

test('models list and retrieve', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map(m => m.id), [MODEL]);
  const model = await client.models.retrieve(MODEL);
  assert.equal(model.id, MODEL);
  assert.equal(model.object, 'model');
  await assert.rejects(client.models.retrieve('no-such-model'), err => err.status === 404);
});

test('completions: unary, streaming with include_usage', async () => {
  const r = await client.completions.create({model: MODEL, prompt: 'Hello', max_tokens: 8,
                                             temperature: 0, ignore_eos: true});
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 8);
  const chunks = await collect(await client.completions.create({
    model: MODEL, prompt: 'Hello', max_tokens: 8, temperature: 0, ignore_eos: true, stream: true,
    stream_options: {include_usage: true}}));
  assert.equal(byIndex(chunks, false)[0].text, r.choices[0].text);
  assert.deepEqual(chunks.at(-1).usage, r.usage);
});

test('chat: unary and streaming agree', async () => {
  const r = await client.chat.completions.create({model: MODEL, messages, max_tokens: 16,
                                                  temperature: 0, ignore_eos: true, ...noThinking});
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  const chunks = await collect(await client.chat.completions.create({
    model: MODEL, messages, max_tokens: 16, temperature: 0, ignore_eos: true, stream: true,
    ...noThinking}));
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(byIndex(chunks, true)[0].text, r.choices[0].message.content ?? '');
});

test('seed: the same seed samples the same text', async () => {
  const ask = seed => client.completions.create({model: MODEL, prompt: 'Seeded', max_tokens: 12,
                                                 temperature: 1, seed, ignore_eos: true});
  const [a, b] = await Promise.all([ask(7), ask(7)]);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test('reasoning: thinking on gives an assistant message', async () => {
  const r = await client.chat.completions.create({model: MODEL, messages, max_tokens: 8,
                                                  temperature: 0});
  const m = r.choices[0].message;
  assert.equal(m.role, 'assistant');
  if ('reasoning_content' in m) assert.equal(typeof m.reasoning_content, 'string');
});

test('tools: accepted with every tool_choice, unknown names refused', async () => {
  const tools = [{type: 'function', function: {name: 'get_weather', description: 'Weather',
                  parameters: {type: 'object', properties: {city: {type: 'string'}}}}}];
  for (const tool_choice of ['none', 'auto', 'required',
                             {type: 'function', function: {name: 'get_weather'}}]) {
    const r = await client.chat.completions.create({model: MODEL, messages, tools, tool_choice,
                                                    max_tokens: 8, temperature: 0});
    assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  }
  await expect400(client.chat.completions.create({
    model: MODEL, messages, tools, tool_choice: {type: 'function', function: {name: 'nope'}}}),
    'tool_choice.function.name');
});

test('stop strings: completions unary and streaming end before the stop string', async () => {
  const {stop, before} = stopFrom(await greedy(false));
  const body = {model: MODEL, prompt: 'Once upon a time', max_tokens: 32, temperature: 0,
                ignore_eos: true, stop: [stop, 'never-generated-\u2603']};
  const r = await client.completions.create(body);
  assert.equal(r.choices[0].text, before);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.usage.completion_tokens < 32);
  const chunks = await collect(await client.completions.create({...body, stream: true}));
  const got = byIndex(chunks, false)[0];
  assert.equal(got.text, before);
  assert.equal(got.finish_reason, 'stop');
  for (const c of chunks) assert.ok(!c.choices[0].text.includes(stop));
});

test('stop strings: chat unary and streaming, a single string', async () => {
  const {stop, before} = stopFrom(await greedy(true));
  const body = {model: MODEL, messages, max_tokens: 32, temperature: 0, ignore_eos: true, stop,
                ...noThinking};
  const r = await client.chat.completions.create(body);
  assert.equal(r.choices[0].message.content ?? '', before);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const got = byIndex(await collect(await client.chat.completions.create({...body, stream: true})),
                      true)[0];
  assert.equal(got.text, before);
  assert.equal(got.finish_reason, 'stop');
});

test('stop strings end the request in the scheduler (its KV is freed)', async () => {
  const {stop, before} = stopFrom(await greedy(false));
  const stopped = await metric('vamp_requests_finished_total', {reason: 'stop'});
  const e2e = await metric('vamp_request_e2e_latency_seconds_count');
  const r = await client.completions.create({model: MODEL, prompt: 'Once upon a time',
                                             max_tokens: 1900, temperature: 0, ignore_eos: true,
                                             stop});
  assert.equal(r.choices[0].text, before);
  await waitFor(async () => (await metric('vamp_scheduler_requests_running')) === 0,
                'the scheduler to drop the stopped request', 2000);
  assert.equal(await metric('vamp_requests_finished_total', {reason: 'stop'}), stopped + 1);
  assert.equal(await metric('vamp_request_e2e_latency_seconds_count'), e2e + 1,
               'a request a stop string ended has an end-to-end latency');
});

test('n: choices indexed 0..n-1, choice i seeded seed + i, prompt counted once', async () => {
  const body = {model: MODEL, prompt: 'Many ways', max_tokens: 6, temperature: 1, seed: 100,
                ignore_eos: true};
  const r = await client.completions.create({...body, n: 3});
  assert.deepEqual(r.choices.map(c => c.index), [0, 1, 2]);
  const single = await Promise.all([0, 1, 2].map(i => client.completions.create({...body,
                                                                                  seed: 100 + i})));
  single.forEach((s, i) => assert.equal(r.choices[i].text, s.choices[0].text));
  assert.equal(r.usage.prompt_tokens, single[0].usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 18);
  const chunks = await collect(await client.chat.completions.create({
    model: MODEL, messages, max_tokens: 5, temperature: 1, seed: 5, ignore_eos: true, n: 2,
    stream: true, stream_options: {include_usage: true}, ...noThinking}));
  const got = byIndex(chunks, true);
  assert.deepEqual(Object.keys(got), ['0', '1']);
  assert.equal(got[0].finish_reason, 'length');
  assert.equal(got[1].finish_reason, 'length');
  assert.equal(chunks.at(-1).usage.completion_tokens, 10);
  await expect400(client.completions.create({...body, n: 17}), 'n');
});

test('batch: two prompts x n = 2, choices indexed prompt * n + j, seeds seed + index', async () => {
  const prompts = ['Once upon a time', 'The robot said'];
  const body = {model: MODEL, max_tokens: 5, temperature: 1, seed: 40, ignore_eos: true};
  const r = await client.completions.create({...body, prompt: prompts, n: 2, echo: true});
  assert.deepEqual(r.choices.map(c => c.index), [0, 1, 2, 3]);
  // Choice i is prompt i / 2 alone with seed 40 + i.
  const single = await Promise.all([0, 1, 2, 3].map(
      i => client.completions.create({...body, prompt: prompts[Math.floor(i / 2)], seed: 40 + i})));
  single.forEach((s, i) => {
    assert.equal(r.choices[i].text, prompts[Math.floor(i / 2)] + s.choices[0].text, `choice ${i}`);
  });
  assert.equal(
      r.usage.prompt_tokens, single[0].usage.prompt_tokens + single[2].usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 20);
  // Streamed: every index, each with the same text as unary (same seeds), usage at the end.
  const chunks = await collect(await client.completions.create({
    ...body,
    prompt: prompts,
    n: 2,
    echo: true,
    stream: true,
    stream_options: {include_usage: true}
  }));
  const got = byIndex(chunks, false);
  assert.deepEqual(Object.keys(got), ['0', '1', '2', '3']);
  for (let i = 0; i < 4; ++i) assert.equal(got[i].text, r.choices[i].text, `streamed choice ${i}`);
  assert.deepEqual(chunks.at(-1).usage, r.usage);
  // Token-id prompts batch too; a batch over --max_batch_prompts (64) is refused naming prompt.
  const ids = await client.completions.create({...body, prompt: [[1, 2, 3], [4, 5]]});
  assert.equal(ids.choices.length, 2);
  assert.equal(ids.usage.prompt_tokens, 5);
  await expect400(client.completions.create({...body, prompt: Array(65).fill('x')}), 'prompt');
  await expect400(client.completions.create({...body, prompt: Array(5).fill('x'), n: 16}), 'n');
});

test('n: a client that goes away aborts every choice (of every prompt of a batch)', async () => {
  for (const [prompt, choices] of [['Long', 2], [['Long', 'Longer'], 4]]) {
    const aborted = await metric('vamp_requests_finished_total', {reason: 'abort'});
    const controller = new AbortController();
    const stream = await client.completions.create(
        {model: MODEL, prompt, max_tokens: 1900, ignore_eos: true, n: 2, stream: true},
        {signal: controller.signal});
    let received = 0;
    try {
      for await (const chunk of stream) {
        received += chunk.choices.length;
        controller.abort();  // the SDK ends the stream (or throws, by version)
      }
    } catch (err) {
      assert.ok(err instanceof OpenAI.APIUserAbortError || err.name === 'AbortError', `${err}`);
    }
    assert.ok(received >= 1);
    await waitFor(
        async () =>
            (await metric('vamp_requests_finished_total', {reason: 'abort'})) === aborted + choices,
        `all ${choices} choices to be aborted`);
  }
});

test('min_p: min_p 1 keeps only the most likely token, so sampling equals greedy', async () => {
  const body = {model: MODEL, prompt: 'Once upon a time', max_tokens: 12, ignore_eos: true};
  const greedyText = (await client.completions.create({...body, temperature: 0})).choices[0].text;
  const r = await client.completions.create({...body, temperature: 1.5, seed: 3, min_p: 1});
  assert.equal(r.choices[0].text, greedyText);
});

test('min_tokens: stop tokens cannot end the output before min_tokens', async () => {
  const body = {model: MODEL, prompt: 'Once upon a time', max_tokens: 8, temperature: 0};
  const first = (await client.completions.create({...body, ignore_eos: true}))
                    .choices[0].token_ids[0];
  const stopped = await client.completions.create({...body, stop_token_ids: [first]});
  assert.equal(stopped.usage.completion_tokens, 1);
  const held = await client.completions.create({...body, stop_token_ids: [first], min_tokens: 4});
  assert.ok(held.usage.completion_tokens >= 4, JSON.stringify(held.choices[0]));
  assert.notEqual(held.choices[0].token_ids[0], first);
});

test('penalties: presence, frequency and repetition run and are deterministic', async () => {
  const body = {model: MODEL, messages, max_tokens: 16, temperature: 0, ignore_eos: true,
                presence_penalty: 1.5, frequency_penalty: 0.5, repetition_penalty: 1.3,
                ...noThinking};
  const [a, b] = await Promise.all([client.chat.completions.create(body),
                                    client.chat.completions.create(body)]);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.equal(a.usage.completion_tokens, 16);
  const got = byIndex(await collect(await client.chat.completions.create({...body, stream: true})),
                      true)[0];
  assert.equal(got.text, a.choices[0].message.content ?? '');
  await expect400(client.chat.completions.create({...body, presence_penalty: 3}),
                  'presence_penalty');
  await expect400(client.completions.create({model: MODEL, prompt: 'x', min_p: 2}), 'min_p');
});

test('logprobs: each chosen token, chat and completions, unary and streaming', async () => {
  const chat = await client.chat.completions.create({
    model: MODEL, messages, max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: true,
    top_logprobs: 0, ...noThinking});
  const content = chat.choices[0].logprobs.content;
  assert.equal(content.length, 6);
  for (const c of content) {
    assert.ok(c.logprob <= 0 && Number.isFinite(c.logprob), JSON.stringify(c));
    assert.equal(Buffer.from(c.bytes).length, c.bytes.length);
  }
  const joined = Buffer.concat(content.map(c => Buffer.from(c.bytes))).toString('utf8');
  assert.equal(joined, chat.choices[0].message.content);
  const streamed = await collect(await client.chat.completions.create({
    model: MODEL, messages, max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: true,
    stream: true, ...noThinking}));
  const streamedLogprobs = streamed.flatMap(c => c.choices[0]?.logprobs?.content ?? []);
  assert.deepEqual(streamedLogprobs.map(c => c.logprob), content.map(c => c.logprob));
  const r = await client.completions.create({model: MODEL, prompt: 'Once upon a time',
                                             max_tokens: 5, temperature: 0, ignore_eos: true,
                                             logprobs: 0});
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  assert.equal(lp.token_logprobs.length, 5);
  assert.deepEqual(
      lp.text_offset, lp.tokens.map((_, i) => Buffer.from(lp.tokens.slice(0, i).join('')).length));
});

test('echo with logprobs: the prompt\'s tokens scored, then the output\'s', async () => {
  const body = {model: MODEL, max_tokens: 3, temperature: 0, ignore_eos: true};
  const r = await client.completions.create(
      {...body, prompt: 'Once upon a time', echo: true, logprobs: 2});
  const lp = r.choices[0].logprobs;
  const n = r.usage.prompt_tokens + 3;
  assert.equal(lp.tokens.length, n);
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  assert.ok(r.choices[0].text.startsWith('Once upon a time'));
  assert.equal(lp.token_logprobs[0], null);  // nothing precedes the first token
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < n; ++i) {
    assert.ok(Number.isFinite(lp.token_logprobs[i]) && lp.token_logprobs[i] <= 0, `token ${i}`);
    const top = Object.values(lp.top_logprobs[i]);
    assert.ok(top.length >= 1 && top.length <= 3, JSON.stringify(lp.top_logprobs[i]));
    assert.ok(Math.max(...top) >= lp.token_logprobs[i] - 1e-6);
  }
  assert.deepEqual(
      lp.text_offset, lp.tokens.map((_, i) => Buffer.from(lp.tokens.slice(0, i).join('')).length));
  // A prompt token's logprob is what the model gave it as the next token of the prefix: the
  // greedy token after ids, scored as the last token of a longer prompt.
  const ids = [9707, 11, 1879, 374];
  const next = await client.completions.create({...body, prompt: ids, max_tokens: 1, logprobs: 0});
  const nextId = next.choices[0].token_ids[0];
  const nextLogprob = next.choices[0].logprobs.token_logprobs[0];
  const scored =
      await client.completions.create({...body, prompt: [...ids, nextId], echo: true, logprobs: 1});
  const slp = scored.choices[0].logprobs;
  assert.ok(
      Math.abs(slp.token_logprobs[ids.length] - nextLogprob) < 1e-5,
      `${slp.token_logprobs[ids.length]} vs ${nextLogprob}`);
  // Batched, n = 2 and streamed: each choice's first chunk starts with its prompt's tokens; the
  // chunks add up to the unary logprobs.
  const prompts = ['Once upon a time', 'The robot said'];
  const unary =
      await client.completions.create({...body, prompt: prompts, n: 2, echo: true, logprobs: 1});
  const chunks = await collect(await client.completions.create(
      {...body, prompt: prompts, n: 2, echo: true, logprobs: 1, stream: true}));
  for (let i = 0; i < 4; ++i) {
    const mine = chunks.flatMap(c => c.choices.filter(x => x.index === i));
    assert.deepEqual(
        mine.flatMap(c => c.logprobs.token_logprobs), unary.choices[i].logprobs.token_logprobs,
        `choice ${i}`);
    assert.deepEqual(
        mine.flatMap(c => c.logprobs.text_offset), unary.choices[i].logprobs.text_offset);
    assert.ok(unary.choices[i].text.startsWith(prompts[Math.floor(i / 2)]));
  }
});

test('top_logprobs: alternatives, chat and completions, unary and streaming', async () => {
  const body = {
    model: MODEL,
    messages,
    max_tokens: 5,
    temperature: 0,
    ignore_eos: true,
    logprobs: true,
    top_logprobs: 3,
    ...noThinking
  };
  const chat = await client.chat.completions.create(body);
  const content = chat.choices[0].logprobs.content;
  assert.equal(content.length, 5);
  for (const c of content) {
    assert.equal(c.top_logprobs.length, 3, JSON.stringify(c));
    const values = c.top_logprobs.map(t => t.logprob);
    for (let i = 1; i < values.length; ++i) assert.ok(values[i - 1] >= values[i], values);
    // Greedy: the chosen token is the most likely one, with the same raw logprob.
    assert.equal(c.logprob, Math.max(...values));
    assert.equal(c.top_logprobs[0].token, c.token);
    for (const t of c.top_logprobs) {
      assert.ok(t.logprob <= 0 && Number.isFinite(t.logprob), JSON.stringify(t));
      assert.ok(t.bytes.every(b => Number.isInteger(b) && b >= 0 && b < 256), JSON.stringify(t));
    }
  }
  const streamed = await collect(await client.chat.completions.create({...body, stream: true}));
  assert.deepEqual(streamed.flatMap(c => c.choices[0]?.logprobs?.content ?? []), content);

  const completion = {
    model: MODEL,
    prompt: 'Once upon a time',
    max_tokens: 5,
    temperature: 0,
    ignore_eos: true,
    logprobs: 2
  };
  const r = await client.completions.create(completion);
  const lp = r.choices[0].logprobs;
  assert.equal(lp.top_logprobs.length, 5);
  lp.top_logprobs.forEach((top, i) => {
    // The chosen token and the 2 most likely (fewer keys when their strings coincide).
    const values = Object.values(top);
    assert.ok(values.length >= 1 && values.length <= 3, JSON.stringify(top));
    assert.equal(top[lp.tokens[i]], lp.token_logprobs[i]);
    assert.equal(lp.token_logprobs[i], Math.max(...values));
  });
  const chunks = await collect(await client.completions.create({...completion, stream: true}));
  assert.deepEqual(
      chunks.flatMap(c => c.choices[0]?.logprobs?.top_logprobs ?? []), lp.top_logprobs);

  await expect400(
      client.chat.completions.create({model: MODEL, messages, logprobs: true, top_logprobs: 21}),
      'top_logprobs');
  await expect400(client.completions.create({model: MODEL, prompt: 'x', logprobs: 6}), 'logprobs');
});

test('logprobs with penalties are the raw model\'s', async () => {
  // Penalties and min_p shape what is sampled; the logprobs are the raw model's (vLLM's default):
  // the first token's alternatives are those of the unpenalised request (presence and frequency
  // count outputs only, so the first step's raw logits are the same), and every chosen token's
  // logprob equals its entry among the alternatives.
  const body = {model: MODEL, messages, max_tokens: 6, temperature: 0, ignore_eos: true,
                logprobs: true, top_logprobs: 5, ...noThinking};
  const plain = (await client.chat.completions.create(body)).choices[0].logprobs.content;
  const penalised = (await client.chat.completions.create({
    ...body, presence_penalty: 2, frequency_penalty: 2, min_p: 0.05, min_tokens: 2
  })).choices[0].logprobs.content;
  assert.equal(penalised.length, 6);
  assert.deepEqual(penalised[0].top_logprobs, plain[0].top_logprobs);
  for (const c of penalised) {
    assert.ok(c.logprob <= 0 && Number.isFinite(c.logprob), JSON.stringify(c));
    const entry = c.top_logprobs.find(
        t => t.token === c.token && JSON.stringify(t.bytes) === JSON.stringify(c.bytes));
    if (entry) assert.equal(entry.logprob, c.logprob, JSON.stringify(c));
  }
});

test('echo: completions send the prompt first', async () => {
  const r = await client.completions.create({model: MODEL, prompt: 'Echo this:', max_tokens: 4,
                                             temperature: 0, echo: true, ignore_eos: true});
  const plain = await client.completions.create({model: MODEL, prompt: 'Echo this:',
                                                 max_tokens: 4, temperature: 0, ignore_eos: true});
  assert.equal(r.choices[0].text, 'Echo this:' + plain.choices[0].text);
  const chunks = await collect(await client.completions.create({
    model: MODEL, prompt: 'Echo this:', max_tokens: 4, temperature: 0, echo: true,
    ignore_eos: true, stream: true}));
  assert.equal(byIndex(chunks, false)[0].text, r.choices[0].text);
});

test('bad input is a 400 naming the field', async () => {
  await expect400(client.completions.create({model: MODEL, prompt: 'x', temperature: 5}),
                  'temperature');
  await expect400(client.completions.create({model: MODEL, prompt: 'x', stop: ['']}), 'stop');
  await expect400(client.chat.completions.create({model: MODEL, messages: []}), 'messages');
  await expect400(client.chat.completions.create({model: MODEL, messages,
                                                  response_format: {type: 'json_object'}}),
                  'response_format');
  await expect400(client.chat.completions.create({model: MODEL, messages, max_tokens: 0}),
                  'max_tokens');
});
