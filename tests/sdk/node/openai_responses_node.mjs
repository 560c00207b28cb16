// Drives compaction-proxy with the official OpenAI Node SDK's Responses API:
// only the base URL changes. Every request is sent twice, first straight to
// the mock upstream (so the test sees the body the SDK wrote) and then
// through the proxy. Prints one JSON line of what the SDK saw through the proxy.
import OpenAI from "openai";

const proxy = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-sdk-test-key", maxRetries: 0 });
const direct = new OpenAI({ baseURL: process.argv[3], apiKey: "sk-sdk-test-key", maxRetries: 0 });

const items = [];
for (let i = 0; i < 30; i++) {
  items.push({ role: "user", content: `question ${i}: ` + "tell me more about shipping. ".repeat(8) });
  if (i % 10 === 5) {
    items.push({ type: "reasoning", id: `rs_${i}`, summary: [{ type: "summary_text", text: "look the schedule up" }] });
    items.push({ type: "function_call", call_id: `call_${i}`, name: "schedule", arguments: JSON.stringify({ leg: i }) });
    items.push({ type: "function_call_output", call_id: `call_${i}`, output: "Monday and Thursday. ".repeat(6) });
  }
  items.push({
    type: "message", role: "assistant",
    content: [{ type: "output_text", text: `answer ${i}: ` + "it ships on Monday. ".repeat(8) }],
  });
}
items.push({ role: "user", content: [{ type: "input_text", text: "and the return leg?" }] });

// The text of a response's output messages (what the Python SDK's
// `output_text` gives; not every Node SDK version fills it in).
const outputText = (r) =>
  r.output.flatMap((o) => o.content ?? []).filter((c) => c.type === "output_text").map((c) => c.text).join("");

await direct.responses.create({ model: "mock", instructions: "You are terse.", input: items });
const { data: response, response: raw } = await proxy.responses
  .create({ model: "mock", instructions: "You are terse.", input: items })
  .withResponse();

for await (const _ of await direct.responses.create({ model: "mock", input: items, stream: true })) {
  // drained: only the request matters
}
let streamed = "";
let completed = null;
for await (const event of await proxy.responses.create({ model: "mock", input: items, stream: true })) {
  if (event.type === "response.output_text.delta") streamed += event.delta;
  if (event.type === "response.completed") completed = outputText(event.response);
}
console.log(JSON.stringify({
  sent_items: items.length,
  text: outputText(response),
  status_header: raw.headers.get("x-compaction-status"),
  output_messages_header: raw.headers.get("x-compaction-output-messages"),
  streamed_text: streamed,
  completed_text: completed,
}));
