// Drives compaction-proxy with the official OpenAI Node SDK, as a new user
// would: only the base URL changes. Prints one JSON line of what it saw.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-sdk-test-key", maxRetries: 0 });
const history = [{ role: "system", content: "You are terse." }];
for (let i = 0; i < 40; i++) {
  history.push({ role: "user", content: `question ${i}: ` + "tell me more about shipping. ".repeat(8) });
  history.push({ role: "assistant", content: `answer ${i}: ` + "it ships on Monday. ".repeat(8) });
}
history.push({ role: "user", content: "and the return leg?" });

const { data: completion, response } = await client.chat.completions
  .create({ model: "mock", messages: history })
  .withResponse();
let streamed = "";
const stream = await client.chat.completions.create({ model: "mock", messages: history, stream: true });
for await (const chunk of stream) {
  streamed += chunk.choices[0]?.delta?.content ?? "";
}
console.log(JSON.stringify({
  sent_messages: history.length,
  text: completion.choices[0].message.content,
  status_header: response.headers.get("x-compaction-status"),
  output_messages_header: response.headers.get("x-compaction-output-messages"),
  streamed_text: streamed,
}));
