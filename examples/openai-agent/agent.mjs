#!/usr/bin/env node
// A small agent on ctxd's OpenAI-compatible door, with the official openai
// client and nothing ctxd-specific but the base URL: it keeps one
// conversation, resends the whole history with every question (as agents
// do), streams each answer, and prints how much of the prompt ctxd's
// backend reused.
//
//   OPENAI_BASE_URL=http://127.0.0.1:11435/v1 OPENAI_API_KEY=ctxd_... \
//     node agent.mjs "first question" "a follow-up" ...
//
// With no questions on the command line it reads one per line from stdin.
// OPENAI_MODEL picks the model ("ctxd", the default, is whatever ctxd serves).
import OpenAI from 'openai';
import { createInterface } from 'node:readline';

const client = new OpenAI({ maxRetries: 0 }); // reads OPENAI_BASE_URL and OPENAI_API_KEY
const model = process.env.OPENAI_MODEL ?? 'ctxd';
let turn = 0;
const messages = [{ role: 'system', content: 'You are a coding agent. Answer from the codex; say which file.' }];

async function ask(question) {
  messages.push({ role: 'user', content: question });
  const stream = await client.chat.completions.create({
    model, messages, stream: true, stream_options: { include_usage: true },
  });
  let answer = '';
  let usage;
  let summary; // ctxd's own figures, beside OpenAI's
  for await (const chunk of stream) {
    const piece = chunk.choices[0]?.delta?.content ?? '';
    answer += piece;
    process.stdout.write(piece);
    if (chunk.usage) usage = chunk.usage;
    if (chunk.ctxd) summary = chunk.ctxd;
  }
  messages.push({ role: 'assistant', content: answer });
  // usage is this agent's own part of the prompt; the whole prompt, with
  // the codex ctxd put in it, is in ctxd's summary.
  const prompt = summary?.prompt_tokens ?? usage.prompt_tokens;
  const cached = summary ? prompt - summary.evaluated_tokens : (usage.prompt_tokens_details?.cached_tokens ?? 0);
  const pct = ((100 * cached) / prompt).toFixed(1);
  turn++;
  console.log(`\n[turn ${turn}: ${prompt} prompt tokens, ${cached} cached (${pct}%), ${usage.prompt_tokens} of them ours, ${usage.completion_tokens} answered]`);
}

try {
  const questions = process.argv.slice(2);
  if (questions.length > 0) {
    for (const q of questions) await ask(q);
  } else {
    for await (const line of createInterface({ input: process.stdin })) {
      if (line.trim()) await ask(line.trim());
    }
  }
} catch (e) {
  // The door's errors carry a message that names the problem.
  console.error(`ctxd-agent: ${e.status ?? ''} ${e.message}`);
  process.exit(1);
}
