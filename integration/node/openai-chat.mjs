// A 10-turn conversation through ctxd's OpenAI door with the official
// `openai` client, resending the whole history every turn as agents do
// (odd turns streamed, even turns not), then a text completion, the model
// list and the door's errors. Prints one JSON object for the Go test.
//
//   CTXD_BASE_URL=http://127.0.0.1:PORT/v1 CTXD_TOKEN=ctxd_... CTXD_MODEL=NAME node openai-chat.mjs
import OpenAI from 'openai';

const { CTXD_BASE_URL: baseURL, CTXD_TOKEN: apiKey, CTXD_MODEL: model } = process.env;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const out = { turns: [], errors: {} };

const messages = [{ role: 'system', content: 'You answer questions about the handlers in the codex.' }];
for (let i = 1; i <= 10; i++) {
  messages.push({ role: 'user', content: `Question ${i}: what does Handler${i} return?` });
  const stream = i % 2 === 1;
  let text = '';
  let usage;
  let summary; // ctxd's own field beside OpenAI's
  if (stream) {
    const s = await client.chat.completions.create({ model, messages, stream: true, stream_options: { include_usage: true } });
    for await (const chunk of s) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.usage) usage = chunk.usage;
      if (chunk.ctxd) summary = chunk.ctxd;
    }
  } else {
    const r = await client.chat.completions.create({ model, messages, temperature: 0.7, max_tokens: 50 });
    text = r.choices[0].message.content;
    usage = r.usage;
    summary = r.ctxd;
  }
  messages.push({ role: 'assistant', content: text });
  out.turns.push({
    turn: i, stream, text,
    prompt_tokens: usage.prompt_tokens,
    cached_tokens: usage.prompt_tokens_details?.cached_tokens,
    completion_tokens: usage.completion_tokens,
    backend_cached_tokens: summary?.backend_cached_tokens ?? null,
    // ctxd's whole prompt (usage is the client's own part of it)
    ctxd_prompt_tokens: summary?.prompt_tokens, ctxd_cached_tokens: summary?.cached_tokens,
    client_tokens: summary?.client_tokens, evaluated_tokens: summary?.evaluated_tokens,
  });
}
out.messages = messages;

const c = await client.completions.create({ model, prompt: 'Say hello.' });
out.completion = { text: c.choices[0].text, prompt_tokens: c.usage.prompt_tokens };
out.models = (await client.models.list()).data.map((m) => m.id);

async function expectError(name, fn) {
  try {
    await fn();
    out.errors[name] = { thrown: false };
  } catch (e) {
    out.errors[name] = { thrown: true, class: e.constructor.name, status: e.status, code: e.code, type: e.type, message: e.message };
  }
}
const hi = [{ role: 'user', content: 'hi' }];
await expectError('unknown_model', () => client.chat.completions.create({ model: 'gpt-4o', messages: hi }));
await expectError('bad_token', () => new OpenAI({ baseURL, apiKey: 'ctxd_wrong', maxRetries: 0 }).chat.completions.create({ model, messages: hi }));
await expectError('missing_messages', () => client.chat.completions.create({ model }));
await expectError('over_window', () => client.chat.completions.create({ model, messages: [{ role: 'user', content: 'word '.repeat(20000) }] }));
await expectError('oversize', () => client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x'.repeat(2_000_000) }] }));
await expectError('stream_unknown_model', async () => {
  const s = await client.chat.completions.create({ model: 'nope', messages: hi, stream: true });
  for await (const _ of s) { /* drain */ }
});
console.log(JSON.stringify(out));
