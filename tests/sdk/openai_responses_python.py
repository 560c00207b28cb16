"""Drives compaction-proxy with the official OpenAI Python SDK's Responses
API: only the base URL changes. Every request is sent twice, first straight
to the mock upstream (so the test sees the body the SDK wrote) and then
through the proxy. Prints one JSON line of what the SDK saw through the
proxy."""

import json
import sys

from openai import OpenAI

proxy = OpenAI(base_url=sys.argv[1], api_key="sk-sdk-test-key", max_retries=0)
direct = OpenAI(base_url=sys.argv[2], api_key="sk-sdk-test-key", max_retries=0)

items = []
for i in range(30):
    items.append({"role": "user", "content": f"question {i}: " + "tell me more about shipping. " * 8})
    if i % 10 == 5:
        items.append({"type": "reasoning", "id": f"rs_{i}", "summary": [
            {"type": "summary_text", "text": "look the schedule up"}]})
        items.append({"type": "function_call", "call_id": f"call_{i}", "name": "schedule",
                      "arguments": json.dumps({"leg": i})})
        items.append({"type": "function_call_output", "call_id": f"call_{i}",
                      "output": "Monday and Thursday. " * 6})
    items.append({"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": f"answer {i}: " + "it ships on Monday. " * 8}]})
items.append({"role": "user", "content": [{"type": "input_text", "text": "and the return leg?"}]})

direct.responses.create(model="mock", instructions="You are terse.", input=items)
raw = proxy.responses.with_raw_response.create(model="mock", instructions="You are terse.", input=items)
response = raw.parse()

for event in direct.responses.create(model="mock", input=items, stream=True):
    pass
streamed, completed = [], None
for event in proxy.responses.create(model="mock", input=items, stream=True):
    if event.type == "response.output_text.delta":
        streamed.append(event.delta)
    elif event.type == "response.completed":
        completed = event.response.output_text

print(json.dumps({
    "sent_items": len(items),
    "text": response.output_text,
    "status_header": raw.headers.get("x-compaction-status"),
    "output_messages_header": raw.headers.get("x-compaction-output-messages"),
    "streamed_text": "".join(streamed),
    "completed_text": completed,
}))
