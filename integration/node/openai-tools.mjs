// The official `openai` client's tool calling against ctxd's OpenAI door:
// a request that offers tools gets a tool call (not streamed, then with the
// client's stream helper), the client runs the tool and sends the result
// back, and the answer comes as text. Prints one JSON object.
//
//   CTXD_BASE_URL=http://127.0.0.1:PORT/v1 CTXD_TOKEN=ctxd_... node openai-tools.mjs
import OpenAI from 'openai';

const { CTXD_BASE_URL: baseURL, CTXD_TOKEN: apiKey } = process.env;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const tools = [{
  type: 'function',
  function: { name: 'grep', description: 'Search the codex.', parameters: { type: 'object', properties: { pattern: { type: 'string' } }, required: ['pattern'] } },
}];
const out = {};
const messages = [{ role: 'user', content: 'Where is Listen defined?' }];

const r = await client.chat.completions.create({ model: 'ctxd', messages, tools });
out.plain = { finish_reason: r.choices[0].finish_reason, message: r.choices[0].message };

const stream = client.chat.completions.stream({ model: 'ctxd', messages, tools });
const final = await stream.finalChatCompletion();
out.stream = { finish_reason: final.choices[0].finish_reason, message: final.choices[0].message };

const call = r.choices[0].message.tool_calls[0];
messages.push(r.choices[0].message);
messages.push({ role: 'tool', tool_call_id: call.id, content: `daemon/listen.go:12: func Listen(${JSON.parse(call.function.arguments).pattern})` });
const answer = await client.chat.completions.create({ model: 'ctxd', messages, tools });
out.after = { finish_reason: answer.choices[0].finish_reason, content: answer.choices[0].message.content, ctxd: answer.ctxd };
console.log(JSON.stringify(out));
