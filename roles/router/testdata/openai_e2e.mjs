// Drives tilert router with the official openai npm client; prints one
// JSON object with what came back (the Go test checks it).
// usage: node openai_e2e.mjs BASE_URL MODEL PROMPT MAX_TOKENS
import OpenAI from "openai";

const [baseURL, model, prompt, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const n = Number(maxTokens);
const out = {};

const c = await client.completions.create({ model, prompt, max_tokens: n, temperature: 0, ignore_eos: true });
out.completion = { text: c.choices[0].text, finish: c.choices[0].finish_reason, usage: c.usage };

let text = "", finish = null, usage = null, chunks = 0;
const s = await client.completions.create({ model, prompt, max_tokens: n, temperature: 0, ignore_eos: true,
  stream: true, stream_options: { include_usage: true } });
for await (const ch of s) {
  if (ch.usage) usage = ch.usage;
  for (const choice of ch.choices) { text += choice.text; if (choice.finish_reason) finish = choice.finish_reason; chunks++; }
}
out.completion_stream = { text, finish, usage, chunks };

const messages = [{ role: "user", content: prompt }];
const cc = await client.chat.completions.create({ model, messages, max_completion_tokens: n, temperature: 0, ignore_eos: true });
out.chat = { text: cc.choices[0].message.content, role: cc.choices[0].message.role, finish: cc.choices[0].finish_reason, usage: cc.usage };

text = ""; finish = null; usage = null;
const cs = await client.chat.completions.create({ model, messages, max_completion_tokens: n, temperature: 0, ignore_eos: true,
  stream: true, stream_options: { include_usage: true } });
for await (const ch of cs) {
  if (ch.usage) usage = ch.usage;
  for (const choice of ch.choices) { text += choice.delta.content ?? ""; if (choice.finish_reason) finish = choice.finish_reason; }
}
out.chat_stream = { text, finish, usage };

try {
  await client.completions.create({ model, prompt, n: 1025 }); // past what the router serves in waves
  out.error = { status: 0 };
} catch (e) {
  out.error = { status: e.status, param: e.param ?? e.error?.param, message: e.message, kind: e.constructor.name };
}
const models = await client.models.list();
out.models = models.data.map((m) => m.id);
console.log(JSON.stringify(out));
