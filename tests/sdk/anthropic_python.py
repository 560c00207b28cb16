"""Drives compaction-proxy with the official Anthropic Python SDK, as a user
of a Claude-based agent would: only the base URL changes. Every request is
sent twice, first straight to the mock upstream (so the test sees the body
the SDK wrote) and then through the proxy (the body it forwarded). Prints
one JSON line of what the SDK saw through the proxy."""

import json
import sys

import anthropic

proxy_url, upstream_url = sys.argv[1], sys.argv[2]
proxy = anthropic.Anthropic(base_url=proxy_url, api_key="sk-ant-sdk-test-key", max_retries=0)
direct = anthropic.Anthropic(base_url=upstream_url, api_key="sk-ant-sdk-test-key", max_retries=0)

system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
history = []
for i in range(30):
    history.append({"role": "user", "content": f"question {i}: " + "tell me more about shipping. " * 8})
    history.append({"role": "assistant", "content": [
        {"type": "thinking", "thinking": f"turn {i}: recall the schedule.", "signature": f"sig-{i}"},
        {"type": "text", "text": f"answer {i}: " + "it ships on Monday. " * 8},
    ]})
history.append({"role": "user", "content": [
    {"type": "text", "text": "and the return leg?", "cache_control": {"type": "ephemeral"}},
]})
tools = [{
    "name": "read_file",
    "description": "Reads a file of the repository.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}]
sent = []


def create(**kwargs):
    direct.messages.create(model="mock", max_tokens=256, system=system, **kwargs)
    sent.append(len(kwargs["messages"]))
    return proxy.messages.with_raw_response.create(model="mock", max_tokens=256, system=system, **kwargs)


raw = create(messages=history)
message = raw.parse()

# A tool round: the answer is a tool_use; its tool_result goes back.
first = create(messages=history, tools=tools).parse()
tool_use = next(b for b in first.content if b.type == "tool_use")
with_result = history + [
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": tool_use.id, "name": tool_use.name, "input": tool_use.input},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool_use.id, "content": "fn main() {}"},
    ]},
]
second = create(messages=with_result, tools=tools).parse()

with direct.messages.stream(model="mock", max_tokens=256, system=system, messages=history) as stream:
    stream.get_final_message()
sent.append(len(history))
with proxy.messages.stream(model="mock", max_tokens=256, system=system, messages=history) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()

print(json.dumps({
    "sent_messages": sent,
    "text": message.content[0].text,
    "status_header": raw.headers.get("x-compaction-status"),
    "output_messages_header": raw.headers.get("x-compaction-output-messages"),
    "tool_use": {"name": tool_use.name, "input": tool_use.input, "stop_reason": first.stop_reason},
    "tool_round_text": second.content[0].text,
    "streamed_text": streamed,
    "final_text": final.content[0].text,
}))
