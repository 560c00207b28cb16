"""Drives compaction-proxy with the official OpenAI Python SDK, as a new user
would: only the base URL changes. Prints one JSON line of what it saw."""

import json
import sys

from openai import OpenAI

base_url = sys.argv[1]
client = OpenAI(base_url=base_url, api_key="sk-sdk-test-key", max_retries=0)
history = [{"role": "system", "content": "You are terse."}]
for i in range(40):
    history.append({"role": "user", "content": f"question {i}: " + "tell me more about shipping. " * 8})
    history.append({"role": "assistant", "content": f"answer {i}: " + "it ships on Monday. " * 8})
history.append({"role": "user", "content": "and the return leg?"})

raw = client.chat.completions.with_raw_response.create(model="mock", messages=history)
completion = raw.parse()
streamed = []
stream = client.chat.completions.create(model="mock", messages=history, stream=True)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        streamed.append(chunk.choices[0].delta.content)

print(json.dumps({
    "sent_messages": len(history),
    "text": completion.choices[0].message.content,
    "status_header": raw.headers.get("x-compaction-status"),
    "output_messages_header": raw.headers.get("x-compaction-output-messages"),
    "streamed_text": "".join(streamed),
}))
