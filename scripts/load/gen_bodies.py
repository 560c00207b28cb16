#!/usr/bin/env python3
"""Write the request bodies the load harness sends.

Chat-completions bodies of about 1 KB, 20 KB and 200 KB, made of ~1 KB
messages of English-like text (a Zipf-weighted vocabulary, fixed seed), so
every run sends the same bytes and dedupe finds little to merge, as in real
conversations. The 200 KB body carries the marker __NONCE__ in its last user
message; the wrk script post.lua replaces it with a different number on every
request, so each request misses the proxy's cache and is compacted, its
history the same as the request before (as a conversation's next turn).
large-allnew.json has the marker in every message: no request's history was
seen before (as a conversation's first compaction).
medium-new.json is the 20 KB body with the marker: it fits its budget but is
new on every request, as each turn of a real conversation is, so it is parsed
every time instead of found in the cache.

Usage: gen_bodies.py OUT_DIR
Writes small.json, medium.json, medium-new.json, large.json, large-allnew.json,
invalid.json and sse.json (a small body with "stream": true).
"""

import json
import random
import sys
from pathlib import Path

COMMON = (
    "the a to of and in is it for on with that this we you can will be not are "
    "order shipment customer warehouse delivery status tracking number refund "
    "invoice address carrier package delayed arrived scheduled update request "
    "account payment confirmed pending returned damaged replacement support "
    "ticket agent Berlin Hamburg Munich Tuesday Friday morning afternoon today "
    "tomorrow please check again thanks sorry issue problem solution service"
).split()
SYLLABLES = (
    "ka ro mi ten sel dor an ve lu pra ing ex con ment tion ber ster ple qua fi "
    "gra nol tur sha pen vis ard lo mer ic"
).split()


def vocabulary(rng):
    words = list(COMMON)
    while len(words) < len(COMMON) + 4000:
        words.append("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    return words, weights


def sentence(rng, words, weights):
    picked = rng.choices(words, weights=weights, k=rng.randint(6, 18))
    return " ".join(picked).capitalize() + rng.choice(".....!?")


def text_of(rng, words, weights, chars):
    parts = []
    total = 0
    while total < chars:
        s = sentence(rng, words, weights)
        parts.append(s)
        total += len(s) + 1
    return " ".join(parts)


def conversation(rng, words, weights, target_bytes, last_prefix=""):
    """A system message, then user/assistant turns of ~1 KB until the body
    reaches target_bytes, ending on a user message."""
    messages = [{"role": "system", "content": "You are a helpful logistics support agent."}]
    body = {"model": "gpt-4o-mini", "messages": messages, "temperature": 0.2}
    per_message = min(1000, max(100, target_bytes // 6))
    role = "user"
    while len(json.dumps(body)) + 1.6 * per_message < target_bytes:
        messages.append({"role": role, "content": text_of(rng, words, weights, per_message)})
        role = "assistant" if role == "user" else "user"
    if role == "assistant":
        messages.append({"role": "assistant", "content": text_of(rng, words, weights, per_message // 2)})
    messages.append({"role": "user", "content": last_prefix + text_of(rng, words, weights, per_message // 2)})
    return body


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20261130)
    words, weights = vocabulary(rng)
    bodies = {
        "small.json": conversation(rng, words, weights, 1024),
        "medium.json": conversation(rng, words, weights, 20 * 1024),
        "large.json": conversation(rng, words, weights, 200 * 1024, last_prefix="Request __NONCE__. "),
    }
    # The 20 KB body with a marker: a conversation that fits its budget
    # but is new on every turn, as real ones are (parsed every time).
    medium_new = json.loads(json.dumps(bodies["medium.json"]))
    medium_new["messages"][-1]["content"] = "Request __NONCE__. " + medium_new["messages"][-1]["content"]
    bodies["medium-new.json"] = medium_new
    # The 200 KB body with a marker in every message: a history no earlier
    # request sent, as a conversation's first compaction is (large.json
    # changes only its last message, as a conversation's next turn does).
    large_new = json.loads(json.dumps(bodies["large.json"]))
    for message in large_new["messages"][:-1]:
        message["content"] = "Note __NONCE__. " + message["content"]
    bodies["large-allnew.json"] = large_new
    sse = conversation(rng, words, weights, 1024)
    sse["stream"] = True
    bodies["sse.json"] = sse
    for name, body in bodies.items():
        (out / name).write_text(json.dumps(body))
    # Declares JSON but is not: the proxy forwards it untouched (skipped).
    (out / "invalid.json").write_text('{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "unterminated')
    for name in sorted(p.name for p in out.iterdir() if p.suffix == ".json"):
        path = out / name
        chars = 0
        if name != "invalid.json":
            chars = sum(len(m["content"]) for m in json.loads(path.read_text())["messages"])
        print(f"{name}: {path.stat().st_size} bytes, {chars} content chars")


if __name__ == "__main__":
    main()
