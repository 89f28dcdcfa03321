#!/usr/bin/env node
// A conversation on ctxd's Ollama-compatible door with the official ollama
// client and nothing ctxd-specific but the host and the token: it resends
// the whole history with every question, streams each answer, and prints
// how much of the prompt ctxd's backend reused.
//
//   CTXD_URL=http://127.0.0.1:11435 CTXD_TOKEN=ctxd_... node chat.mjs "first question" "a follow-up" ...
//
// OLLAMA_MODEL picks the model ("ctxd", the default, is whatever ctxd serves).
import { Ollama } from 'ollama';

const { CTXD_URL: host, CTXD_TOKEN: token } = process.env;
const model = process.env.OLLAMA_MODEL ?? 'ctxd';
const ollama = new Ollama({ host, headers: { Authorization: `Bearer ${token}` } });
const messages = [];

try {
  for (const [i, question] of process.argv.slice(2).entries()) {
    messages.push({ role: 'user', content: question });
    let answer = '';
    let last;
    for await (const part of await ollama.chat({ model, messages, stream: true })) {
      answer += part.message.content;
      process.stdout.write(part.message.content);
      last = part;
    }
    messages.push({ role: 'assistant', content: answer });
    // prompt_eval_count is this client's own part of the prompt; the whole
    // prompt, with the codex ctxd put in it, is in ctxd's summary.
    const s = last.ctxd.summary;
    const cached = s.prompt_tokens - s.evaluated_tokens;
    console.log(`\n[ollama turn ${i + 1}: ${s.prompt_tokens} prompt tokens, ${cached} cached (${((100 * cached) / s.prompt_tokens).toFixed(1)}%), ${last.prompt_eval_count} of them ours]`);
  }
} catch (e) {
  // The door's errors carry a message that names the problem.
  console.error(`ctxd-ollama-chat: ${e.status_code ?? ''} ${e.message}`);
  process.exit(1);
}
