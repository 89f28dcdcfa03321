// The official `ollama` client against ctxd's Ollama door: chats that send
// num_ctx 2048, then 8192, then 4096 (which would make Ollama reload the
// model each time), streamed and not, a generate, the model list, show,
// ps, version and the door's errors. Prints one JSON object.
//
//   CTXD_HOST=http://127.0.0.1:PORT CTXD_TOKEN=ctxd_... CTXD_MODEL=NAME node ollama-chat.mjs
import { Ollama } from 'ollama';

const { CTXD_HOST: host, CTXD_TOKEN: token, CTXD_MODEL: model } = process.env;
const ollama = new Ollama({ host, headers: { Authorization: `Bearer ${token}` } });
const out = { chats: [], errors: {} };

const messages = [];
for (const [i, numCtx] of [2048, 8192, 4096].entries()) {
  messages.push({ role: 'user', content: `Question ${i + 1}: which handler serves kind ${i + 1}?` });
  let text = '';
  let last;
  if (i % 2 === 0) {
    for await (const part of await ollama.chat({ model, messages, stream: true, options: { num_ctx: numCtx } })) {
      text += part.message.content;
      last = part;
    }
  } else {
    last = await ollama.chat({ model, messages, options: { num_ctx: numCtx, num_batch: 64 } });
    text = last.message.content;
  }
  messages.push({ role: 'assistant', content: text });
  out.chats.push({ num_ctx: numCtx, text, done: last.done, done_reason: last.done_reason, prompt_eval_count: last.prompt_eval_count, ctxd: last.ctxd });
}

const g = await ollama.generate({ model, prompt: 'Say hello.', system: 'Be brief.', stream: false });
out.generate = { response: g.response, done: g.done, prompt_eval_count: g.prompt_eval_count };
out.list = (await ollama.list()).models.map((m) => m.name);
const show = await ollama.show({ model });
out.show_context_length = Object.entries(show.model_info ?? {}).find(([k]) => k.endsWith('.context_length'))?.[1];
out.ps = (await ollama.ps()).models.map((m) => m.name);
out.version = (await ollama.version()).version;

async function expectError(name, fn) {
  try {
    await fn();
    out.errors[name] = { thrown: false };
  } catch (e) {
    out.errors[name] = { thrown: true, class: e.constructor.name, status: e.status_code, message: e.message };
  }
}
await expectError('unknown_model', () => ollama.chat({ model: 'llama3', messages: [{ role: 'user', content: 'hi' }], stream: false }));
await expectError('bad_token', () => new Ollama({ host, headers: { Authorization: 'Bearer ctxd_wrong' } }).list());
await expectError('over_window', () => ollama.chat({ model, messages: [{ role: 'user', content: 'word '.repeat(20000) }], stream: false }));
await expectError('oversize', () => ollama.chat({ model, messages: [{ role: 'user', content: 'x'.repeat(2_000_000) }], stream: false }));
await expectError('format', () => ollama.chat({ model, messages: [{ role: 'user', content: 'hi' }], format: 'json', stream: false }));
console.log(JSON.stringify(out));
