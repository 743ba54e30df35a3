// Drives tilert router's chat completions with the official openai npm
// client for a list of cases (tool calls, reasoning), streamed and not;
// prints one JSON object per case with what the client saw.
// usage: node openai_tools_e2e.mjs BASE_URL CASES_JSON_FILE
import OpenAI from "openai";
import { readFileSync } from "node:fs";

const [baseURL, casesFile] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const cases = JSON.parse(readFileSync(casesFile, "utf8"));
const out = {};
for (const c of cases) {
  const r = { content: null, reasoning: null, tool_calls: [], finish: null, chunks: 0, tool_deltas: 0 };
  if (!c.body.stream) {
    const res = await client.chat.completions.create(c.body);
    const m = res.choices[0].message;
    r.content = m.content ?? null;
    r.reasoning = m.reasoning_content ?? null;
    r.tool_calls = (m.tool_calls ?? []).map((t) => ({ id: t.id, type: t.type, name: t.function.name, arguments: t.function.arguments }));
    r.finish = res.choices[0].finish_reason;
    r.logprobs = res.choices[0].logprobs?.content?.length ?? 0;
  } else {
    const stream = await client.chat.completions.create(c.body);
    const calls = [];
    r.logprobs = 0;
    for await (const ch of stream) {
      r.chunks++;
      for (const choice of ch.choices) {
        const d = choice.delta ?? {};
        if (d.content) r.content = (r.content ?? "") + d.content;
        if (d.reasoning_content) r.reasoning = (r.reasoning ?? "") + d.reasoning_content;
        for (const t of d.tool_calls ?? []) {
          r.tool_deltas++;
          if (!calls[t.index]) calls[t.index] = { id: "", type: "", name: "", arguments: "" };
          const cur = calls[t.index];
          if (t.id) cur.id = t.id;
          if (t.type) cur.type = t.type;
          if (t.function?.name) cur.name += t.function.name;
          if (t.function?.arguments) cur.arguments += t.function.arguments;
        }
        if (choice.logprobs?.content) r.logprobs += choice.logprobs.content.length;
        if (choice.finish_reason) r.finish = choice.finish_reason;
      }
    }
    r.tool_calls = calls;
  }
  out[c.name] = r;
}
console.log(JSON.stringify(out));
