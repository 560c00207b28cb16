#!/usr/bin/env python3
"""Derives the Anthropic Messages and OpenAI Responses forms of the 150-turn
agent fixture (a chat-completions body), deterministically:

    python3 tests/data/convert_agent_fixture.py [OUT_DIR]

writes OUT_DIR/agent-150-turns.anthropic.json and .responses.json (OUT_DIR
defaults to tests/data/fixtures, where the committed copies live; a test
checks that they are this script's output).

Anthropic: the system message becomes top-level `system` (a text block with
a cache breakpoint); consecutive messages of one role merge into one message
(tool results first in a user turn, as the API requires); tool calls become
`tool_use` blocks, tool messages `tool_result` blocks; every 8th tool-using
assistant turn opens with a signed `thinking` block; a breakpoint sits on
one tool result at about a third of the conversation and on the last block.

Responses: the system message becomes `instructions`; assistant text is an
output message, tool calls are `function_call` items (every 8th turn's led
by a `reasoning` item), tool messages `function_call_output` items.
"""

import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fixtures", "agent-150-turns.json")
EPHEMERAL = {"type": "ephemeral"}


def signature(text):
    return hashlib.sha256(text.encode()).hexdigest()


def anthropic_parts(content):
    """Chat content (a string or text and image_url parts) as blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for part in content or []:
        if part["type"] == "text":
            blocks.append({"type": "text", "text": part["text"]})
        else:
            url = part["image_url"]["url"]
            media_type, data = url[len("data:"):].split(";base64,")
            blocks.append({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
    return blocks


def responses_parts(content, text_type):
    """Chat content (a string or text and image_url parts) as parts."""
    if isinstance(content, str):
        return [{"type": text_type, "text": content}] if content else []
    return [{"type": text_type, "text": p["text"]} if p["type"] == "text"
            else {"type": "input_image", "image_url": p["image_url"]["url"], "detail": "auto"}
            for p in content or []]


def tool_names(chat):
    return [t["function"]["name"] for t in chat["tools"]]


def to_anthropic(chat):
    system = [m for m in chat["messages"] if m["role"] == "system"]
    messages = []  # [role, blocks]
    tool_turns = 0
    for m in chat["messages"]:
        role = m["role"]
        if role == "system":
            continue
        blocks = []
        if role == "tool":
            role = "user"
            blocks.append({"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]})
        else:
            blocks.extend(anthropic_parts(m.get("content")))
            calls = m.get("tool_calls") or []
            if calls:
                tool_turns += 1
                if tool_turns % 8 == 1:
                    thought = "Next: " + ", ".join(c["function"]["name"] for c in calls) + "."
                    blocks.insert(0, {"type": "thinking", "thinking": thought, "signature": signature(thought)})
            for c in calls:
                blocks.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                               "input": json.loads(c["function"]["arguments"])})
        if messages and messages[-1][0] == role:
            previous = messages[-1][1]
            if any(b["type"] == "thinking" for b in blocks):
                # Thinking opens its assistant turn.
                messages[-1][1] = blocks[:1] + previous + blocks[1:]
            else:
                previous.extend(blocks)
        else:
            messages.append([role, blocks])
    for role, blocks in messages:
        if role == "user":
            blocks.sort(key=lambda b: b["type"] != "tool_result")  # stable: results first
    results = [b for role, blocks in messages for b in blocks if b["type"] == "tool_result"]
    results[len(results) // 3]["cache_control"] = EPHEMERAL
    messages[-1][1][-1]["cache_control"] = EPHEMERAL
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "temperature": chat["temperature"],
        "system": [{"type": "text", "text": m["content"], "cache_control": EPHEMERAL} for m in system],
        "tools": [{"name": n, "input_schema": {"type": "object"}} for n in tool_names(chat)],
        "messages": [{"role": role, "content": blocks} for role, blocks in messages],
    }
    return body


def to_responses(chat):
    items = []
    instructions = "\n".join(m["content"] for m in chat["messages"] if m["role"] == "system")
    tool_turns = 0
    for n, m in enumerate(chat["messages"]):
        role = m["role"]
        if role == "system":
            continue
        if role == "user":
            items.append({"type": "message", "role": "user",
                          "content": responses_parts(m["content"], "input_text")})
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        else:
            if m.get("content"):
                parts = responses_parts(m["content"], "output_text")
                for part in parts:
                    part["annotations"] = []
                items.append({"type": "message", "role": "assistant", "id": f"msg_{n:04}", "status": "completed",
                              "content": parts})
            calls = m.get("tool_calls") or []
            if calls:
                tool_turns += 1
                if tool_turns % 8 == 1:
                    thought = "Next: " + ", ".join(c["function"]["name"] for c in calls) + "."
                    items.append({"type": "reasoning", "id": f"rs_{n:04}",
                                  "summary": [{"type": "summary_text", "text": thought}]})
            for k, c in enumerate(calls):
                items.append({"type": "function_call", "id": f"fc_{n:04}_{k}", "call_id": c["id"],
                              "name": c["function"]["name"], "arguments": c["function"]["arguments"],
                              "status": "completed"})
    return {
        "model": "gpt-5-mini",
        "instructions": instructions,
        "temperature": chat["temperature"],
        "store": False,
        "tools": [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in tool_names(chat)],
        "input": items,
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "fixtures")
    with open(SOURCE, encoding="utf-8") as f:
        chat = json.load(f)
    for suffix, body in (("anthropic", to_anthropic(chat)), ("responses", to_responses(chat))):
        path = os.path.join(out, f"agent-150-turns.{suffix}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(body, f, indent=1, ensure_ascii=False)
            f.write("\n")


if __name__ == "__main__":
    main()
