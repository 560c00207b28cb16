#!/usr/bin/env python3
"""A scripted, strict fake LLM upstream for driving real coding agents.

It speaks Anthropic Messages (POST /v1/messages, /v1/messages/count_tokens),
OpenAI Responses (POST /v1/responses) and OpenAI chat completions
(POST /v1/chat/completions), streaming (SSE) and not. For every request it

- validates the body the way the real API does and answers 400 in that API's
  error shape when it is invalid;
- for Anthropic, runs the preserved-thinking prefix check: each thinking block
  it returns carries a signature that is an HMAC over the block's prefix (top
  level system, tools, every message before the assistant turn holding the
  block and the blocks before it in that turn) and the thinking text; a block
  sent back whose prefix changed is refused (or dropped, when the request asks
  for `drop_block` with the beta header);
- answers from a script: turn k of a session gets tool call k (read a file,
  grep, list a directory, run a shell command over the tree given with
  --tree), and after --turns turns a final text answer. The turn number and
  the session travel in the tool-call ids, so the script does not depend on
  how much history a proxy forwarded;
- bills the request: input tokens are estimated as characters / 4 of the
  canonical JSON of each prefix item (tools, system, each message or input
  item); the items identical to the previous request of the same session cost
  0.1, Anthropic cache writes (up to the last cache_control breakpoint, not
  already cached) 1.25, the rest 1.0. Output is not billed;
- records the request (body, headers without secrets, status, bill) to
  --log-dir as one JSON file per request.

`fake_upstream.py tap --listen PORT --target URL --log-dir DIR` is a
pass-through that records the x-compaction-* response headers the proxy
returns to the client, which the upstream cannot see.

Python 3.11 standard library only.
"""

import argparse
import base64
import copy
import hashlib
import hmac
import http.client
import json
import os
import re
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET_HEADERS = {"authorization", "x-api-key", "api-key", "cookie", "set-cookie",
                  "proxy-authorization", "chatgpt-account-id"}
BINDING_BETA = "thinking-binding-controls-2026-08-01"
HMAC_KEY = b"fake-upstream-thinking-binding"


class Invalid(Exception):
    """A request the real API would refuse with 400."""

    def __init__(self, message, reason, param=None):
        super().__init__(message)
        self.message = message
        self.reason = reason  # short category, counted by the runner
        self.param = param


def canonical(value):
    """Canonical JSON of a prefix item: sorted keys, no cache_control (the
    prefix check and the prompt cache leave cache markers out)."""
    return json.dumps(strip_cache_control(value), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def strip_cache_control(value):
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value


def tokens(chars):
    return (chars + 3) // 4


def short_hash(text, n=8):
    return hashlib.sha256(text.encode()).hexdigest()[:n]


# ---------------------------------------------------------------- the script

class Script:
    """What the fake model does at turn k, in terms of generic actions, and
    how each action maps onto the tools the client offers."""

    PATTERNS = ["fn ", "pub struct", "impl ", "Result<", "match ", "tracing::",
                "serde_json", "pub fn", "#[test]", "Option<"]

    def __init__(self, tree, turns, recall_file=None):
        self.tree = os.path.abspath(tree) if tree else os.getcwd()
        self.turns = turns
        # --recall-file: turn 0 reads this file, and the model asks for it
        # back with compaction_recall once the proxy has cut it (see Recall)
        self.recall_file = recall_file
        files, dirs = [], set()
        for root, _, names in os.walk(os.path.join(self.tree, "src")):
            for name in names:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, self.tree)
                dirs.add(os.path.relpath(root, self.tree))
                if name.endswith(".rs") and 2000 <= os.path.getsize(path) <= 30000:
                    files.append(rel)
        self.files = sorted(files) or ["README.md"]
        self.dirs = sorted(dirs) or ["."]

    def action(self, k):
        if k == 0 and self.recall_file:
            return {"kind": "read", "path": self.recall_file}
        f = self.files[(k * 7) % len(self.files)]
        kind = ["read", "grep", "read", "list", "shell"][k % 5]
        if kind == "read":
            return {"kind": "read", "path": f}
        if kind == "grep":
            return {"kind": "grep", "pattern": self.PATTERNS[(k // 5) % len(self.PATTERNS)],
                    "path": self.dirs[(k // 5) % len(self.dirs)]}
        if kind == "list":
            return {"kind": "list", "path": self.dirs[(k // 5) % len(self.dirs)]}
        return {"kind": "shell", "command": f"wc -l {f} && sed -n '1,160p' {f}"}

    def describe(self, a):
        if a["kind"] == "read":
            return f"read {a['path']}"
        if a["kind"] == "grep":
            return f"search for `{a['pattern']}` in {a['path']}"
        if a["kind"] == "list":
            return f"list {a['path']}"
        return f"run `{a['command']}`"

    def call(self, k, tools):
        """(tool name, arguments dict) for turn k given the client's tools
        as a list of (name, json schema)."""
        a = self.action(k)
        by_name = {name: schema for name, schema in tools}
        absolute = lambda p: os.path.join(self.tree, p)

        def pick(*names):
            for n in names:
                if n in by_name:
                    return n
            return None

        def props(name):
            schema = by_name.get(name) or {}
            return (schema.get("properties") or {}).keys()

        if a["kind"] == "read":
            name = pick("Read", "read", "read_file", "view")
            if name:
                key = next((p for p in ("file_path", "filePath", "path") if p in props(name)), "file_path")
                return name, {key: absolute(a["path"])}
            return self.shell_call(f"cat {a['path']}", by_name)
        if a["kind"] == "grep":
            name = pick("Grep", "grep")
            if name:
                args = {"pattern": a["pattern"], "path": absolute(a["path"])}
                if "output_mode" in props(name):
                    args["output_mode"] = "content"
                    if "-n" in props(name):
                        args["-n"] = True
                    if "head_limit" in props(name):
                        args["head_limit"] = 120
                return name, args
            return self.shell_call(f"grep -rn '{a['pattern']}' {a['path']} | head -120", by_name)
        if a["kind"] == "list":
            name = pick("LS", "list", "list_dir")
            if name:
                key = next((p for p in ("path", "dir_path") if p in props(name)), "path")
                return name, {key: absolute(a["path"])}
            name = pick("Glob", "glob")
            if name:
                return name, {"pattern": "**/*", "path": absolute(a["path"])}
            return self.shell_call(f"ls -la --time-style=+ {a['path']}", by_name)
        return self.shell_call(a["command"], by_name)

    def shell_call(self, command, by_name):
        for name in ("Bash", "bash"):
            if name in by_name:
                return name, {"command": command, "description": "Inspect the source tree"}
        if "exec_command" in by_name:
            return "exec_command", {"cmd": command, "workdir": self.tree}
        if "shell_command" in by_name:
            return "shell_command", {"command": command, "workdir": self.tree}
        if "shell" in by_name:
            return "shell", {"command": ["bash", "-lc", command], "workdir": self.tree}
        name = next(iter(by_name), "bash")
        return name, {"command": command}

    def thinking(self, k):
        return f"Turn {k}: the task needs evidence from the tree; {self.describe(self.action(k))} next."

    def final_text(self, turns_done):
        return (f"I inspected the repository over {turns_done} tool calls. The source tree is "
                f"a Rust HTTP proxy; its modules are {', '.join(self.dirs[:8])}. Done.")


SUMMARY_TEXT = ("<analysis>The user asked for a survey of the source tree; the assistant read files, "
                "searched for patterns and listed directories.</analysis>\n<summary>1. Primary Request and "
                "Intent: survey the repository.\n2. Files read: several modules under src/.\n3. No edits were "
                "made.\n4. Next step: continue the survey.</summary>")


def summary_text(session, turn):
    """The answer to an agent's own compaction request. The marker lets the
    script go on at the turn it reached once the history is the summary."""
    return SUMMARY_TEXT.replace("</summary>", f"\n(harness-resume h{session}t{turn - 1})</summary>")


def is_agent_compaction(text):
    t = text.lower()
    return ("create a detailed summary of the conversation" in t
            or "context checkpoint compaction" in t
            or "context summarization" in t
            or "summarize the conversation" in t
            or "provide a detailed summary" in t
            or "respond with text only" in t)


# ------------------------------------------------------------- recall

RECALL_TOOL = "compaction_recall"
RECALL_ID_RE = re.compile(r"compaction_recall id: (rc_[A-Za-z0-9_.\-]+)")
RECALL_ANSWER = "[compaction_recall rc_"
SECRET_RE = re.compile(r"VAULT-TOKEN-[0-9A-F]+")


class Recall:
    """What the model does with compaction-proxy's `compaction_recall` tool
    (--recall-file): the file turn 0 read holds a token in its middle; once
    the proxy has cut or dropped that tool result, the model calls the tool
    with the id of the marker that stands for it, and once the tool's
    answer is in the request it ends the session with the token."""

    # --recall-then-continue: sessions whose recall was answered go on with
    # the script instead of ending
    go_on = False
    answered = set()

    @staticmethod
    def step(session, tools, results, raw):
        """None (go on with the script), ("call", ids) or ("answer", text).
        results: (tool call id, text) of every tool result in the request."""
        if RECALL_TOOL not in {name for name, _ in tools} or session in Recall.answered:
            return None
        answers = [text for _, text in results if text.startswith(RECALL_ANSWER)]
        if answers and Recall.go_on:
            Recall.answered.add(session)
            return None
        if answers:
            found = SECRET_RE.search("\n".join(answers))
            if found:
                return "answer", f"The vault token in the file I read first is {found.group(0)}."
            return "answer", "I could not get the vault token back."
        first = [text for cid, text in results if cid.endswith(f"h{session}t0")]
        if first:
            ids = [i for i in RECALL_ID_RE.findall(first[0]) if i.startswith("rc_t")]
        else:
            # the result was dropped: the markers of the dropped runs
            ids = [i for i in dict.fromkeys(RECALL_ID_RE.findall(raw)) if i.startswith("rc_d")]
        return ("call", ids[-1:] if first else ids) if ids else None


def result_text(block):
    c = block.get("content")
    if isinstance(c, str):
        return c
    return "".join(p.get("text", "") for p in c or [] if isinstance(p, dict))


# ------------------------------------------------------------- bookkeeping

class Sessions:
    """Per session: the previous accepted request's prefix items."""

    def __init__(self):
        self.lock = threading.Lock()
        self.previous = {}

    def bill(self, session, items, breakpoint_index):
        """items: canonical strings in cache order. breakpoint_index: index of
        the last item holding a cache_control marker (Anthropic), or None."""
        with self.lock:
            prev = self.previous.get(session)
            self.previous[session] = items
        common = 0
        if prev is not None:
            while common < len(prev) and common < len(items) and prev[common] == items[common]:
                common += 1
        extends = prev is not None and common == len(prev)
        cached = sum(len(i) for i in items[:common])
        write = 0
        if breakpoint_index is not None and breakpoint_index >= common:
            write = sum(len(i) for i in items[common:breakpoint_index + 1])
        rest = sum(len(i) for i in items) - cached - write
        t_cached, t_write, t_rest = tokens(cached), tokens(write), tokens(rest)
        return {
            "first": prev is None, "extends": extends,
            "cached_tokens": t_cached, "cache_write_tokens": t_write, "uncached_tokens": t_rest,
            "input_tokens": t_cached + t_write + t_rest,
            "billed": round(0.1 * t_cached + 1.25 * t_write + 1.0 * t_rest, 1),
        }


class Recorder:
    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.lock = threading.Lock()
        self.seq = 0
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)

    def record(self, entry, raw=None):
        """One JSON file per request; the body as sent beside it (.body)."""
        if not self.log_dir:
            return
        with self.lock:
            self.seq += 1
            entry["seq"] = self.seq
            name = os.path.join(self.log_dir, f"{self.seq:05d}")
        if raw is not None:
            with open(name + ".body", "wb") as f:
                f.write(raw)
        with open(name + ".json", "w") as f:
            json.dump(entry, f, ensure_ascii=False)


def safe_headers(headers):
    return {k.lower(): ("<redacted>" if k.lower() in SECRET_HEADERS else v)
            for k, v in headers.items()}


# ------------------------------------------------------------- anthropic

def anthropic_error(message, kind="invalid_request_error"):
    return {"type": "error", "error": {"type": kind, "message": message},
            "request_id": "req_fake" + short_hash(message, 16)}


def blocks_of(content):
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def check_text(block, where):
    text = block.get("text")
    if not isinstance(text, str):
        raise Invalid(f"{where}.text: Field required", "text-missing")
    if text == "":
        raise Invalid("messages: text content blocks must be non-empty", "empty-text")
    if not text.strip():
        raise Invalid("messages: text content blocks must contain non-whitespace text",
                      "whitespace-text")


def validate_anthropic(body, beta):
    if not isinstance(body, dict):
        raise Invalid("body: Input should be an object", "not-object")
    for field in ("model", "max_tokens", "messages"):
        if field not in body:
            raise Invalid(f"{field}: Field required", f"missing-{field}")
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise Invalid("messages: at least one message is required", "no-messages")
    system = body.get("system")
    if isinstance(system, list):
        for j, b in enumerate(system):
            if b.get("type") != "text":
                raise Invalid(f"system.{j}.type: Input should be 'text'", "system-block")
            check_text(b, f"system.{j}")
    thinking = body.get("thinking")
    if isinstance(thinking, dict):
        t = thinking.get("type")
        if t not in ("enabled", "disabled", "adaptive"):
            raise Invalid("thinking.type: Input should be 'enabled', 'disabled' or 'adaptive'", "thinking-type")
        if t == "enabled":
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or budget < 1024:
                raise Invalid("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
                              "thinking-budget")
            if budget >= body["max_tokens"]:
                raise Invalid("`max_tokens` must be greater than `thinking.budget_tokens`.", "thinking-budget")
        if "block_binding" in thinking:
            if BINDING_BETA not in beta:
                raise Invalid("thinking.block_binding: This setting requires the "
                              f"`{BINDING_BETA}` value in the `anthropic-beta` header.", "binding-without-beta")
            mode = (thinking["block_binding"] or {}).get("prefix_mismatch_behavior")
            if mode not in ("error", "drop_block"):
                raise Invalid("thinking.block_binding.prefix_mismatch_behavior: Input should be 'error' or 'drop_block'",
                              "binding-value")
    # Roles: user and assistant, merged when consecutive; system entries
    # (mid-conversation instructions) anywhere but first.
    first = msgs[0]
    if not isinstance(first, dict) or first.get("role") != "user":
        raise Invalid("messages: first message must use the \"user\" role", "first-not-user")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise Invalid(f"messages.{i}: Input should be an object", "message-not-object")
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise Invalid(f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'", "role")
        content = m.get("content")
        last = i == len(msgs) - 1
        if isinstance(content, str):
            if content == "" and not (last and role == "assistant"):
                raise Invalid(f"messages.{i}: all messages must have non-empty content except for the optional final assistant message",
                              "empty-content")
            if content and not content.strip():
                raise Invalid("messages: text content blocks must contain non-whitespace text", "whitespace-text")
            continue
        if not isinstance(content, list):
            raise Invalid(f"messages.{i}.content: Input should be a valid list", "content-type")
        if not content and not (last and role == "assistant"):
            raise Invalid(f"messages.{i}: all messages must have non-empty content except for the optional final assistant message",
                          "empty-content")
        for j, b in enumerate(content):
            where = f"messages.{i}.content.{j}"
            if not isinstance(b, dict) or "type" not in b:
                raise Invalid(f"{where}: Input should be an object with a type", "block")
            bt = b["type"]
            if role == "system" and bt != "text":
                raise Invalid(f"{where}.type: system messages only take text blocks", "system-block")
            if bt == "text":
                check_text(b, where)
            elif bt == "tool_use":
                if role != "assistant":
                    raise Invalid(f"{where}: tool_use blocks are only allowed in assistant messages", "tool-use-role")
                if not re.fullmatch(r"[a-zA-Z0-9_-]+", str(b.get("id", ""))):
                    raise Invalid(f"{where}.id: String should match pattern '^[a-zA-Z0-9_-]+$'", "tool-use-id")
                if not isinstance(b.get("input"), dict):
                    raise Invalid(f"{where}.input: Input should be a valid dictionary", "tool-use-input")
            elif bt == "tool_result":
                if role != "user":
                    raise Invalid(f"{where}: tool_result blocks are only allowed in user messages", "tool-result-role")
                rc = b.get("content")
                if isinstance(rc, list):
                    for r, part in enumerate(rc):
                        if isinstance(part, dict) and part.get("type") == "text":
                            check_text(part, f"{where}.content.{r}")
            elif bt in ("thinking", "redacted_thinking"):
                if role != "assistant":
                    raise Invalid(f"{where}: thinking blocks are only allowed in assistant messages", "thinking-role")
                if bt == "thinking" and not isinstance(b.get("signature"), str):
                    raise Invalid(f"{where}.thinking.signature: Field required", "thinking-signature")
    # tool_use / tool_result pairing over merged role groups.
    groups = []  # (role, [(msg index, block index, block)])
    for i, m in enumerate(msgs):
        if m["role"] == "system":
            continue
        blocks = [(i, j, b) for j, b in enumerate(blocks_of(m["content"]))]
        if groups and groups[-1][0] == m["role"]:
            groups[-1][1].extend(blocks)
        else:
            groups.append((m["role"], blocks))
    for g, (role, blocks) in enumerate(groups):
        if role != "assistant":
            continue
        uses = [b["id"] for _, _, b in blocks if b.get("type") == "tool_use"]
        if not uses:
            continue
        nxt = groups[g + 1][1] if g + 1 < len(groups) else None
        if nxt is None:
            continue  # an open assistant turn: the model continues it
        answered = {b.get("tool_use_id") for _, _, b in nxt if b.get("type") == "tool_result"}
        missing = [u for u in uses if u not in answered]
        if missing:
            i = blocks[-1][0]
            raise Invalid(f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                          f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                          "in the next message.", "tool-use-without-result")
    for g, (role, blocks) in enumerate(groups):
        if role != "user":
            continue
        prev = groups[g - 1][1] if g > 0 else []
        offered = {b.get("id") for _, _, b in prev if b.get("type") == "tool_use"}
        for i, j, b in blocks:
            if b.get("type") == "tool_result" and b.get("tool_use_id") not in offered:
                raise Invalid(f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                              f"{b.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                              "`tool_use` block in the previous message.", "tool-result-without-use")


def anthropic_prefix_items(body):
    """Prefix items in cache order: each tool, each system block, each
    message. Returns (items, index of last item with a cache breakpoint)."""
    items, breakpoint = [], None
    for t in body.get("tools") or []:
        if "cache_control" in json.dumps(t):
            breakpoint = len(items)
        items.append(canonical(t))
    for b in blocks_of(body.get("system")) if body.get("system") is not None else []:
        if "cache_control" in b:
            breakpoint = len(items)
        items.append(canonical(b))
    for m in body["messages"]:
        if "cache_control" in json.dumps(m):
            breakpoint = len(items)
        items.append(canonical({"role": m.get("role"), "content": blocks_of(m.get("content"))}))
    return items, breakpoint


def binding_prefix(body, i, j):
    """What a thinking block at messages[i].content[j] is bound to."""
    system = blocks_of(body.get("system")) if body.get("system") is not None else []
    before = [{"role": m.get("role"), "content": blocks_of(m.get("content"))} for m in body["messages"][:i]]
    own = blocks_of(body["messages"][i].get("content"))[:j]
    return canonical({"system": system, "tools": body.get("tools") or [], "messages": before, "own": own})


def sign(prefix, thinking_text):
    mac = hmac.new(HMAC_KEY, (prefix + "\x00" + thinking_text).encode(), hashlib.sha256).digest()
    return base64.b64encode(b"fake-sig:" + mac).decode()


def prefix_check(body, beta):
    """Verifies every thinking block sent back. Returns the
    input_transformations list (dropped blocks), mutating nothing in the
    caller's view of what was sent; raises Invalid on a mismatch unless
    drop_block was asked for."""
    thinking = body.get("thinking") or {}
    drop = (BINDING_BETA in beta and
            ((thinking.get("block_binding") or {}).get("prefix_mismatch_behavior") == "drop_block"))
    failed = False
    transformations = []
    for i, m in enumerate(body["messages"]):
        if m.get("role") != "assistant" or not isinstance(m.get("content"), list):
            continue
        for j, b in enumerate(m["content"]):
            if b.get("type") != "thinking":
                continue
            path = f"messages.{i}.content.{j}"
            if not failed and b.get("signature") == sign(binding_prefix(body, i, j), b.get("thinking", "")):
                continue
            # This block and every later thinking block are invalid.
            if not drop:
                raise Invalid(f"{path}: Invalid `signature` in `thinking` block. The block is bound to a different "
                              "conversation. Remove the block, or set `thinking.block_binding.prefix_mismatch_behavior` "
                              f"to \"drop_block\". This setting requires the `{BINDING_BETA}` value in the "
                              "`anthropic-beta` header.", "thinking-prefix-mismatch")
            failed = True
            transformations.append({"type": "thinking_dropped", "path": path, "reason": "prefix_mismatch"})
    return transformations


def open_loop_needs_thinking(body):
    """With thinking on, the assistant turn whose tool calls the final user
    message answers must start with a thinking block."""
    thinking = body.get("thinking") or {}
    if thinking.get("type") not in ("enabled", "adaptive"):
        return
    msgs = [m for m in body["messages"] if m.get("role") != "system"]
    if len(msgs) < 2 or msgs[-1].get("role") != "user":
        return
    last_user = blocks_of(msgs[-1].get("content"))
    if not any(b.get("type") == "tool_result" for b in last_user):
        return
    idx = max(i for i, m in enumerate(body["messages"]) if m is msgs[-2])
    blocks = blocks_of(msgs[-2].get("content"))
    if msgs[-2].get("role") != "assistant" or not blocks:
        return
    if blocks[0].get("type") in ("thinking", "redacted_thinking"):
        return  # also when the prefix check dropped it: the API then goes on without it
    raise Invalid(f"messages.{idx}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                  f"`{blocks[0].get('type')}`. When `thinking` is enabled, a final `assistant` message must start "
                  "with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). "
                  "We recommend you include thinking blocks from previous turns. To avoid this requirement, "
                  "disable `thinking`.", "open-loop-without-thinking")


# ------------------------------------------------------------- responses / chat

def openai_error(message, reason, param=None, code=None):
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def validate_responses(body):
    if not isinstance(body, dict):
        raise Invalid("Invalid body: expected an object.", "not-object")
    if "model" not in body:
        raise Invalid("Missing required parameter: 'model'.", "missing-model", "model")
    items = body.get("input")
    if isinstance(items, str) or items is None:
        return
    if not isinstance(items, list):
        raise Invalid("Invalid type for 'input'.", "input-type", "input")
    calls, outputs = {}, {}
    for n, it in enumerate(items):
        if not isinstance(it, dict):
            raise Invalid(f"Invalid type for 'input[{n}]'.", "item-type", f"input[{n}]")
        t = it.get("type", "message")
        if t == "message":
            if it.get("role") not in ("user", "assistant", "system", "developer"):
                raise Invalid(f"Invalid value: '{it.get('role')}'. Supported values are: 'assistant', 'system', "
                              "'developer', and 'user'.", "role", f"input[{n}].role")
            content = it.get("content")
            if isinstance(content, list):
                for p, part in enumerate(content):
                    if part.get("type") in ("input_text", "output_text") and not isinstance(part.get("text"), str):
                        raise Invalid(f"Missing required parameter: 'input[{n}].content[{p}].text'.", "text-missing")
        elif t in ("function_call", "custom_tool_call", "local_shell_call"):
            cid = it.get("call_id")
            if not cid:
                raise Invalid(f"Missing required parameter: 'input[{n}].call_id'.", "call-id", f"input[{n}].call_id")
            calls[cid] = n
        elif t in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            cid = it.get("call_id")
            if cid not in calls:
                raise Invalid(f"No tool call found for function call output with call_id {cid}.",
                              "output-without-call", "input")
            outputs[cid] = n
            if "output" not in it:
                raise Invalid(f"Missing required parameter: 'input[{n}].output'.", "output-missing")
    for cid in calls:
        if cid not in outputs:
            raise Invalid(f"No tool output found for function call {cid}.", "call-without-output", "input")


def validate_chat(body):
    if not isinstance(body, dict):
        raise Invalid("Invalid body: expected an object.", "not-object")
    for field in ("model", "messages"):
        if field not in body:
            raise Invalid(f"Missing required parameter: '{field}'.", f"missing-{field}", field)
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise Invalid("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
                      "array instead.", "no-messages", "messages")
    pending = None  # tool_call ids of the last assistant message still to answer
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise Invalid(f"Invalid value: '{role}'.", "role", f"messages[{i}].role")
        if role == "tool":
            if pending is None or m.get("tool_call_id") not in pending:
                raise Invalid("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                              "message with 'tool_calls'.", "tool-without-call", f"messages.[{i}].role")
            pending.discard(m.get("tool_call_id"))
            continue
        if pending:
            raise Invalid("An assistant message with 'tool_calls' must be followed by tool messages responding to "
                          "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                          + ", ".join(sorted(pending)), "call-without-tool", f"messages.[{i}].role")
        pending = None
        if role == "assistant" and m.get("tool_calls"):
            pending = {c.get("id") for c in m["tool_calls"]}
    if pending:
        raise Invalid("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                      "'tool_call_id'. The following tool_call_ids did not have response messages: "
                      + ", ".join(sorted(pending)), "call-without-tool", "messages")


# ------------------------------------------------------------- the server

ID_RE = re.compile(r"h([0-9a-f]{8})t(\d+)")
RESUME_RE = re.compile(r"harness-resume h([0-9a-f]{8})t(\d+)")


class Upstream:
    def __init__(self, args):
        self.script = Script(args.tree, args.turns, args.recall_file)
        Recall.go_on = args.recall_then_continue
        self.sessions = Sessions()
        self.recorder = Recorder(args.log_dir)
        self.prefix_check = not args.no_prefix_check
        self.lock = threading.Lock()
        self.last = None  # (session, turn) of the latest scripted turn

    # session and turn from the ids the script minted; after an agent
    # compacted its own history, from the marker the summary carried
    def locate(self, last_result_id, first_text, path, raw, compaction=False):
        m = ID_RE.search(last_result_id or "")
        if m:
            found = m.group(1), int(m.group(2)) + 1
        elif RESUME_RE.search(raw):
            session, turn = RESUME_RE.findall(raw)[-1]
            found = session, int(turn) + 1
        elif compaction and self.last:
            # an agent's summary request that holds its history as prose
            # (opencode): it summarises the session this upstream serves
            found = self.last
        else:
            return short_hash(path + "\x00" + first_text), 0
        with self.lock:
            self.last = found
        return found


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-upstream/1"

    def log_message(self, *a):
        pass

    @property
    def up(self):
        return self.server.upstream

    # ---- plumbing
    def read_body(self):
        n = int(self.headers.get("content-length") or 0)
        return self.rfile.read(n) if n else b""

    def send_json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", "req_fake")
        self.end_headers()
        self.wfile.write(data)

    def start_sse(self):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def chunk(self, data):
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def sse(self, event, obj):
        head = f"event: {event}\n" if event else ""
        self.chunk((head + "data: " + json.dumps(obj) + "\n\n").encode())

    def end_sse(self, done=False):
        if done:
            self.chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self):
        path = urllib.parse.urlparse(self.path).path
        if path.endswith("/models"):
            models = ["claude-sonnet-4-5", "claude-opus-4-5", "gpt-5-codex", "fake-model"]
            self.send_json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "type": "model", "display_name": m, "created": 0, "owned_by": "fake"}
                for m in models]})
        else:
            self.send_json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
        self.up.recorder.record({"method": "GET", "path": self.path, "headers": safe_headers(self.headers),
                                 "status": 200 if path.endswith("/models") else 404})

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        raw = self.read_body()
        path = urllib.parse.urlparse(self.path).path
        entry = {"method": "POST", "path": self.path, "headers": safe_headers(self.headers), "bytes": len(raw)}
        self.raw_text = raw.decode("utf-8", "replace")
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
            entry["status"], entry["reason"] = 400, "not-json"
            self.up.recorder.record(entry)
            return self.send_json(400, openai_error("We could not parse the JSON body of your request.", "not-json"))
        entry["body"] = body
        try:
            if path.endswith("/v1/messages/count_tokens"):
                validate_anthropic(dict(body, max_tokens=1), self.beta())
                items, _ = anthropic_prefix_items(body)
                entry["status"] = 200
                self.send_json(200, {"input_tokens": tokens(sum(map(len, items)))})
            elif path.endswith("/v1/messages"):
                self.serve_anthropic(body, entry)
            elif path.endswith("/v1/responses"):
                self.serve_responses(body, entry)
            elif path.endswith("/v1/chat/completions"):
                self.serve_chat(body, entry)
            else:
                entry["status"] = 404
                self.send_json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
        except Invalid as e:
            entry["status"], entry["reason"], entry["error"] = 400, e.reason, e.message
            if "/v1/messages" in path:
                self.send_json(400, anthropic_error(e.message))
            else:
                self.send_json(400, openai_error(e.message, e.reason, e.param))
        except (BrokenPipeError, ConnectionResetError):
            entry["status"] = entry.get("status", 499)
        except Exception as e:  # a bug here, not the client's: say so loudly
            import traceback
            entry["status"], entry["reason"], entry["error"] = 500, "fake-upstream-bug", traceback.format_exc()
            print(entry["error"], file=sys.stderr, flush=True)
            try:
                self.send_json(500, {"error": {"message": str(e), "type": "server_error"}})
            except OSError:
                pass
        self.up.recorder.record(entry, raw)

    def beta(self):
        return ",".join(self.headers.get_all("anthropic-beta") or []).replace(" ", "").split(",")

    # ---- anthropic
    def serve_anthropic(self, body, entry):
        beta = self.beta()
        validate_anthropic(body, beta)
        dropped = []
        if self.up.prefix_check:
            dropped = prefix_check(body, beta)
        open_loop_needs_thinking(body)
        msgs = body["messages"]
        last_user = next((m for m in reversed(msgs) if m.get("role") == "user"), msgs[0])
        results = [b for b in blocks_of(last_user.get("content")) if b.get("type") == "tool_result"]
        first_text = "".join(b.get("text", "") for b in blocks_of(msgs[0].get("content")) if b.get("type") == "text")
        session, turn = self.up.locate(results[-1].get("tool_use_id") if results else None, first_text, "/v1/messages", self.raw_text)
        last_text = " ".join(b.get("text", "") for b in blocks_of(last_user.get("content")) if b.get("type") == "text")
        items, breakpoint = anthropic_prefix_items(body)
        bill = self.up.sessions.bill(session, items, breakpoint)
        tools = [(t.get("name"), t.get("input_schema")) for t in body.get("tools") or [] if t.get("name")]
        thinking_on = (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
        content = []
        agent_compaction = is_agent_compaction(last_text)
        if thinking_on:
            text = self.up.script.thinking(turn) if tools and not agent_compaction else "Answer in text."
            # bound to the request's messages: the answer is appended after them
            content.append({"type": "thinking", "thinking": text,
                            "signature": sign(binding_prefix(dict(body, messages=msgs + [{"role": "assistant", "content": []}]),
                                                             len(msgs), 0), text)})
        recall = None
        if self.up.script.recall_file and not agent_compaction:
            results_all = [(b.get("tool_use_id", ""), result_text(b)) for m in msgs if m.get("role") == "user"
                           for b in blocks_of(m.get("content")) if b.get("type") == "tool_result"]
            recall = Recall.step(session, tools, results_all, self.raw_text)
        if agent_compaction:
            content.append({"type": "text", "text": summary_text(session, turn)})
            kind = "agent-compaction"
        elif recall and recall[0] == "call":
            content.append({"type": "text", "text": "The file I read first was cut; I will recall it."})
            content.append({"type": "tool_use", "id": f"toolu_h{session}t{turn}recall", "name": RECALL_TOOL,
                            "input": {"ids": recall[1]}})
            kind = "recall-call"
            entry["recall_ids"] = recall[1]
        elif recall:
            content.append({"type": "text", "text": recall[1]})
            kind = "recall-answer"
        elif tools and turn < self.up.script.turns:
            name, args = self.up.script.call(turn, tools)
            content.append({"type": "text", "text": f"Next I will {self.up.script.describe(self.up.script.action(turn))}."})
            content.append({"type": "tool_use", "id": f"toolu_h{session}t{turn}", "name": name, "input": args})
            kind = "tool-call"
        elif tools:
            content.append({"type": "text", "text": self.up.script.final_text(turn)})
            kind = "final"
        else:
            content.append({"type": "text", "text": "Surveying the source tree"})
            kind = "side"
        out_tokens = tokens(len(json.dumps(content)))
        usage = {"input_tokens": bill["uncached_tokens"], "cache_creation_input_tokens": bill["cache_write_tokens"],
                 "cache_read_input_tokens": bill["cached_tokens"], "output_tokens": out_tokens}
        stop = "tool_use" if content[-1]["type"] == "tool_use" else "end_turn"
        entry.update(status=200, session=session, turn=turn, kind=kind, bill=bill, format="anthropic",
                     dropped_thinking=len(dropped))
        msg = {"id": f"msg_h{session}t{turn}", "type": "message", "role": "assistant", "model": body["model"],
               "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if dropped:
            msg["input_transformations"] = dropped
        if not body.get("stream"):
            return self.send_json(200, msg)
        self.start_sse()
        start = dict(msg, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
        self.sse("message_start", {"type": "message_start", "message": start})
        for n, block in enumerate(content):
            if block["type"] == "thinking":
                self.sse("content_block_start", {"type": "content_block_start", "index": n,
                                                 "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
                self.sse("content_block_delta", {"type": "content_block_delta", "index": n,
                                                 "delta": {"type": "thinking_delta", "thinking": block["thinking"]}})
                self.sse("content_block_delta", {"type": "content_block_delta", "index": n,
                                                 "delta": {"type": "signature_delta", "signature": block["signature"]}})
            elif block["type"] == "text":
                self.sse("content_block_start", {"type": "content_block_start", "index": n,
                                                 "content_block": {"type": "text", "text": ""}})
                self.sse("content_block_delta", {"type": "content_block_delta", "index": n,
                                                 "delta": {"type": "text_delta", "text": block["text"]}})
            else:
                self.sse("content_block_start", {"type": "content_block_start", "index": n,
                                                 "content_block": dict(block, input={})})
                self.sse("content_block_delta", {"type": "content_block_delta", "index": n,
                                                 "delta": {"type": "input_json_delta",
                                                           "partial_json": json.dumps(block["input"])}})
            self.sse("content_block_stop", {"type": "content_block_stop", "index": n})
        self.sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                   "usage": usage})
        self.sse("message_stop", {"type": "message_stop"})
        self.end_sse()

    # ---- responses
    def serve_responses(self, body, entry):
        validate_responses(body)
        items = body.get("input")
        items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else items or []
        outs = [it for it in items if it.get("type") in ("function_call_output", "custom_tool_call_output")]

        def text_of(it):
            c = it.get("content")
            return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c or [] if isinstance(p, dict))

        users = [it for it in items if it.get("type", "message") == "message" and it.get("role") == "user"]
        first_text = text_of(users[0]) if users else ""
        last_item = items[-1] if items else {}
        last_text = text_of(last_item) if last_item.get("type", "message") == "message" else ""
        session, turn = self.up.locate(outs[-1].get("call_id") if outs else None, first_text, "/v1/responses",
                                       self.raw_text)
        # after a compaction item only what follows it counts
        compactions = [n for n, it in enumerate(items) if it.get("type") == "compaction"]
        if compactions and not any(it.get("type") == "function_call_output" for it in items[compactions[-1]:]):
            session, turn = self.up.locate(None, first_text, "/v1/responses", items[compactions[-1]].get("encrypted_content", ""))
        prefix = [canonical(t) for t in body.get("tools") or []]
        if body.get("instructions"):
            prefix.append(canonical(body["instructions"]))
        prefix += [canonical(it) for it in items]
        bill = self.up.sessions.bill(session, prefix, None)
        tools = []
        for t in body.get("tools") or []:
            if t.get("type") == "function":
                tools.append((t.get("name"), t.get("parameters")))
            elif t.get("name"):
                tools.append((t.get("name"), {}))
        rid = f"resp_h{session}t{turn}"
        output = []
        trigger = last_item.get("type") == "compaction_trigger"
        agent_compaction = trigger or is_agent_compaction(last_text)
        if body.get("reasoning") is not None:
            output.append({"type": "reasoning", "id": f"rs_h{session}t{turn}",
                           "summary": [{"type": "summary_text", "text": self.up.script.thinking(turn)}],
                           "encrypted_content": base64.b64encode(f"fake-reasoning:{session}:{turn}".encode()).decode()})
        if trigger:
            # server-side compaction: exactly one opaque compaction item
            output = [{"type": "compaction", "id": f"cmp_h{session}t{turn}",
                       "encrypted_content": f"fake-compaction:harness-resume h{session}t{turn - 1}"}]
            kind = "agent-compaction"
        elif agent_compaction or not tools:
            text = summary_text(session, turn) if agent_compaction else "Surveying the source tree"
            output.append({"type": "message", "id": f"msg_h{session}t{turn}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": text, "annotations": []}]})
            kind = "agent-compaction" if agent_compaction else "side"
        elif turn < self.up.script.turns:
            name, args = self.up.script.call(turn, tools)
            output.append({"type": "function_call", "id": f"fc_h{session}t{turn}", "call_id": f"call_h{session}t{turn}",
                           "name": name, "arguments": json.dumps(args), "status": "completed"})
            kind = "tool-call"
        else:
            output.append({"type": "message", "id": f"msg_h{session}t{turn}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": self.up.script.final_text(turn),
                                        "annotations": []}]})
            kind = "final"
        out_tokens = tokens(len(json.dumps(output)))
        usage = {"input_tokens": bill["input_tokens"], "input_tokens_details": {"cached_tokens": bill["cached_tokens"]},
                 "output_tokens": out_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": bill["input_tokens"] + out_tokens}
        entry.update(status=200, session=session, turn=turn, kind=kind, bill=bill, format="responses")
        resp = {"id": rid, "object": "response", "created_at": int(time.time()), "status": "completed",
                "model": body.get("model"), "output": output, "usage": usage, "error": None,
                "incomplete_details": None, "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}
        if not body.get("stream"):
            return self.send_json(200, resp)
        self.start_sse()
        seq = iter(range(10000))
        ev = lambda t, o: self.sse(t, dict(o, type=t, sequence_number=next(seq)))
        ev("response.created", {"response": dict(resp, status="in_progress", output=[], usage=None)})
        ev("response.in_progress", {"response": dict(resp, status="in_progress", output=[], usage=None)})
        for n, item in enumerate(output):
            if item["type"] == "message":
                ev("response.output_item.added", {"output_index": n, "item": dict(item, content=[], status="in_progress")})
                part = item["content"][0]
                ev("response.content_part.added", {"output_index": n, "item_id": item["id"], "content_index": 0,
                                                   "part": dict(part, text="")})
                ev("response.output_text.delta", {"output_index": n, "item_id": item["id"], "content_index": 0,
                                                  "delta": part["text"]})
                ev("response.output_text.done", {"output_index": n, "item_id": item["id"], "content_index": 0,
                                                 "text": part["text"]})
                ev("response.content_part.done", {"output_index": n, "item_id": item["id"], "content_index": 0,
                                                  "part": part})
            elif item["type"] == "function_call":
                ev("response.output_item.added", {"output_index": n, "item": dict(item, arguments="", status="in_progress")})
                ev("response.function_call_arguments.delta", {"output_index": n, "item_id": item["id"],
                                                              "delta": item["arguments"]})
                ev("response.function_call_arguments.done", {"output_index": n, "item_id": item["id"],
                                                             "arguments": item["arguments"]})
            else:
                ev("response.output_item.added", {"output_index": n, "item": item})
            ev("response.output_item.done", {"output_index": n, "item": item})
        ev("response.completed", {"response": resp})
        self.end_sse()

    # ---- chat completions
    def serve_chat(self, body, entry):
        validate_chat(body)
        msgs = body["messages"]

        def text_of(m):
            c = m.get("content")
            return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c or [] if isinstance(p, dict))

        tool_msgs = [m for m in msgs if m.get("role") == "tool"]
        users = [m for m in msgs if m.get("role") == "user"]
        first_text = text_of(users[0]) if users else ""
        system_text = " ".join(text_of(m) for m in msgs if m.get("role") in ("system", "developer"))
        # a tool result that quotes a summary prompt (a file read) is not one
        last_text = text_of(msgs[-1]) if msgs[-1].get("role") != "tool" else ""
        agent_compaction = is_agent_compaction(system_text + " " + last_text)
        # the latest tool result, also when a user message follows it
        last_id = tool_msgs[-1].get("tool_call_id") if tool_msgs else None
        session, turn = self.up.locate(last_id, first_text, "/v1/chat/completions", self.raw_text, agent_compaction)
        prefix = [canonical(t) for t in body.get("tools") or []] + [canonical(m) for m in msgs]
        bill = self.up.sessions.bill(session, prefix, None)
        tools = [(t["function"].get("name"), t["function"].get("parameters"))
                 for t in body.get("tools") or [] if t.get("type") == "function" and t.get("function")]
        message = {"role": "assistant", "content": None}
        if agent_compaction or not tools:
            message["content"] = summary_text(session, turn) if agent_compaction else "Surveying the source tree"
            kind, finish = ("agent-compaction" if agent_compaction else "side"), "stop"
        elif turn < self.up.script.turns:
            name, args = self.up.script.call(turn, tools)
            message["content"] = f"Next I will {self.up.script.describe(self.up.script.action(turn))}."
            message["tool_calls"] = [{"id": f"call_h{session}t{turn}", "type": "function",
                                      "function": {"name": name, "arguments": json.dumps(args)}}]
            kind, finish = "tool-call", "tool_calls"
        else:
            message["content"] = self.up.script.final_text(turn)
            kind, finish = "final", "stop"
        out_tokens = tokens(len(json.dumps(message)))
        usage = {"prompt_tokens": bill["input_tokens"], "completion_tokens": out_tokens,
                 "total_tokens": bill["input_tokens"] + out_tokens,
                 "prompt_tokens_details": {"cached_tokens": bill["cached_tokens"]}}
        entry.update(status=200, session=session, turn=turn, kind=kind, bill=bill, format="chat")
        cid = f"chatcmpl-h{session}t{turn}"
        base = {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": body.get("model")}
        if not body.get("stream"):
            return self.send_json(200, dict(base, choices=[{"index": 0, "message": message, "finish_reason": finish}],
                                            usage=usage))
        self.start_sse()
        base["object"] = "chat.completion.chunk"
        self.sse(None, dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "finish_reason": None}]))
        if message.get("content"):
            self.sse(None, dict(base, choices=[{"index": 0, "delta": {"content": message["content"]},
                                                "finish_reason": None}]))
        for n, call in enumerate(message.get("tool_calls") or []):
            self.sse(None, dict(base, choices=[{"index": 0, "delta": {"tool_calls": [
                {"index": n, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": ""}}]}, "finish_reason": None}]))
            self.sse(None, dict(base, choices=[{"index": 0, "delta": {"tool_calls": [
                {"index": n, "function": {"arguments": call["function"]["arguments"]}}]}, "finish_reason": None}]))
        self.sse(None, dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
        if (body.get("stream_options") or {}).get("include_usage"):
            self.sse(None, dict(base, choices=[], usage=usage))
        self.end_sse(done=True)


# ------------------------------------------------------------- the tap

class TapHandler(BaseHTTPRequestHandler):
    """Forwards to --target and records the proxy's x-compaction-* headers."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def forward(self):
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        target = urllib.parse.urlparse(self.server.target)
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "content-length")}
        headers["content-length"] = str(len(raw))
        conn.request(self.command, self.path, body=raw, headers=headers)
        resp = conn.getresponse()
        report = {k.lower(): v for k, v in resp.getheaders() if k.lower().startswith("x-compaction-")}
        self.server.recorder.record({"method": self.command, "path": self.path, "status": resp.status,
                                     "bytes": len(raw), "compaction": report})
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        while True:
            data = resp.read1(65536)
            if not data:
                break
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        conn.close()

    do_POST = do_GET = forward


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", nargs="?", default="serve", choices=["serve", "tap"])
    p.add_argument("--listen", type=int, default=0, help="port on 127.0.0.1 (0: any, printed)")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--tree", default=None, help="source tree the scripted tool calls inspect")
    p.add_argument("--turns", type=int, default=50, help="tool-call turns before the final answer")
    p.add_argument("--no-prefix-check", action="store_true", help="do not run the thinking prefix check")
    p.add_argument("--recall-then-continue", action="store_true",
                   help="with --recall-file: once the recall is answered, go on with the script")
    p.add_argument("--recall-file", default=None,
                   help="turn 0 reads this file (relative to --tree); the model recalls it with compaction_recall "
                        "once the proxy cut it (Messages API)")
    p.add_argument("--target", default=None, help="tap: where to forward")
    p.add_argument("--port-file", default=None, help="write the bound port here")
    args = p.parse_args()
    if args.mode == "tap":
        server = ThreadingHTTPServer(("127.0.0.1", args.listen), TapHandler)
        server.target = args.target
        server.recorder = Recorder(args.log_dir)
    else:
        server = ThreadingHTTPServer(("127.0.0.1", args.listen), Handler)
        server.upstream = Upstream(args)
    server.daemon_threads = True
    port = server.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
