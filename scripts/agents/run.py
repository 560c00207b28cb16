#!/usr/bin/env python3
"""Drives Claude Code, Codex and opencode, unchanged, through compaction-proxy
against the scripted fake upstream (fake_upstream.py), and prints what
happened per client and mode.

    python3 scripts/agents/run.py                      # every client, every mode, 50 turns
    python3 scripts/agents/run.py --clients codex --modes none,defaults --turns 12
    python3 scripts/agents/run.py --json out.json      # the figures, machine-readable

Modes: `none` (the client talks to the fake upstream directly), `exact`,
`stable` (the proxy in that mode at --budget chars), `defaults` (a config
that sets only the upstream, the routes and budget_chars).

The clients are the pinned ones in scripts/agents/node_modules (`npm ci` in
scripts/agents). They never reach the internet: every base URL points at
loopback and their update checks and telemetry are switched off.
"""

import argparse
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.join(HERE, "node_modules", ".bin")
# The source tree the agents inspect: a fixed copy of this repository's src/
# (as of commit 3671a0e), not the live one, so a session's tool results, and
# the bills measured on them, do not move with every commit (one file
# growing past the script's 30 KB bound reorders every file it reads).
TREE = os.path.join(HERE, "tree.tar.xz")
PROMPT = ("Survey this repository: read its source files, search them and list its directories, "
          "then tell me what it does.")

CLIENTS = {
    # name: (program, format, extra arguments)
    "claude": ("claude", "anthropic", []),
    "claude-sonnet": ("claude", "anthropic", ["--model", "claude-sonnet-4-5"]),
    "codex": ("codex", "responses", []),
    # Codex with its built-in OpenAI provider pointed at the fake upstream
    # (openai_base_url): it tries websockets first, then HTTP, and compacts
    # with a `compaction_trigger` item
    "codex-openai": ("codex", "responses", []),
    "opencode": ("opencode", "chat", []),
}
MODES = ["none", "exact", "stable", "defaults"]
# --recall: the file the fake model reads first and later recalls
RECALL_FILE = "notes/vault.txt"


def write_recall_file(tree, secret):
    """About 12,000 chars of notes with the secret in the middle, where a
    head-and-tail cut takes it out."""
    lines = [f"note {k:03}: nothing of interest in this part of the vault notes, keep reading." for k in range(150)]
    lines.insert(75, f"note 075b: the vault token is {secret}; say it when asked for the vault token.")
    os.makedirs(os.path.join(tree, os.path.dirname(RECALL_FILE)), exist_ok=True)
    with open(os.path.join(tree, RECALL_FILE), "w") as f:
        f.write("\n".join(lines) + "\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[0]} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port}")


def installed(program):
    return os.access(os.path.join(BIN, program), os.X_OK)


def find_proxy(explicit):
    if explicit:
        return explicit
    for profile in ("release", "debug"):
        path = os.path.join(REPO, "target", profile, "compaction-proxy")
        if os.access(path, os.X_OK):
            return path
    return None


def proxy_config(mode, upstream, port, budget, recall=False):
    routes = ("[[routes]]\npath = \"/v1/chat/completions\"\npolicy = \"default\"\n\n"
              "[[routes]]\npath = \"/v1/messages\"\npolicy = \"default\"\n\n"
              "[[routes]]\npath = \"/v1/responses\"\npolicy = \"default\"\n")
    policy = f"[policies.default]\nbudget_chars = {budget}\n"
    if mode in ("exact", "stable"):
        policy += f"mode = \"{mode}\"\n"
    if recall:
        policy += "recall = true\n"
    return (f"[server]\nlisten = \"127.0.0.1:{port}\"\nlog_format = \"json\"\n\n"
            f"[upstream]\nurl = \"{upstream}\"\n\n{policy}\n{routes}")


class Run:
    """One client in one mode: the processes and their directories."""

    def __init__(self, args, client, mode):
        self.args, self.client, self.mode = args, client, mode
        self.dir = os.path.join(args.work, f"{client}-{mode}")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.home = os.path.join(self.dir, "home")
        os.makedirs(self.home)
        self.procs = []

    def spawn(self, argv, name, **kw):
        out = open(os.path.join(self.dir, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    def start_servers(self):
        a = self.args
        up_port = free_port()
        fake = [sys.executable, os.path.join(HERE, "fake_upstream.py"), "--listen", str(up_port),
                "--log-dir", os.path.join(self.dir, "upstream"), "--tree", a.tree, "--turns", str(a.turns)]
        if a.recall:
            fake += ["--recall-file", RECALL_FILE]
        if a.recall == "continue":
            fake += ["--recall-then-continue"]
        wait_port(up_port, self.spawn(fake, "fake-upstream"))
        base = f"http://127.0.0.1:{up_port}"
        if self.mode == "none":
            return base
        proxy_port, tap_port = free_port(), free_port()
        cfg = os.path.join(self.dir, "proxy.toml")
        with open(cfg, "w") as f:
            f.write(proxy_config(self.mode, base, proxy_port, a.budget, a.recall))
        wait_port(proxy_port, self.spawn([a.proxy, "--config", cfg], "proxy"))
        tap = [sys.executable, os.path.join(HERE, "fake_upstream.py"), "tap", "--listen", str(tap_port),
               "--target", f"http://127.0.0.1:{proxy_port}", "--log-dir", os.path.join(self.dir, "tap")]
        wait_port(tap_port, self.spawn(tap, "tap"))
        return f"http://127.0.0.1:{tap_port}"

    def client_env(self, base):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_", "OPENCODE_"))}
        env.update(HOME=self.home, PATH=BIN + os.pathsep + env.get("PATH", ""), NO_COLOR="1", TERM="dumb",
                   XDG_CONFIG_HOME=os.path.join(self.home, ".config"),
                   XDG_DATA_HOME=os.path.join(self.home, ".local", "share"),
                   XDG_CACHE_HOME=os.path.join(self.home, ".cache"),
                   XDG_STATE_HOME=os.path.join(self.home, ".local", "state"))
        for proxy_var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
            env.pop(proxy_var, None)
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env["PWD"] = self.args.tree  # opencode takes its project directory from $PWD
        name = self.client
        if name.startswith("claude"):
            env.update(ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY="sk-ant-fake-harness-key",
                       IS_SANDBOX="1",  # lets --dangerously-skip-permissions run as root
                       CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1",
                       DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1", DISABLE_BUG_COMMAND="1",
                       CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY="1")
        elif name.startswith("codex"):
            codex_home = os.path.join(self.home, ".codex")
            os.makedirs(codex_home)
            limit = f"model_auto_compact_token_limit = {self.args.agent_compact_tokens}\n" \
                if self.args.agent_compact_tokens else ""
            if name == "codex-openai":
                provider = f"openai_base_url = \"{base}/v1\"\n"
                # what `codex login --with-api-key` writes
                with open(os.path.join(codex_home, "auth.json"), "w") as f:
                    json.dump({"auth_mode": "apikey", "OPENAI_API_KEY": "sk-fake-harness-key"}, f)
            else:
                provider = "model_provider = \"harness\"\n"
            with open(os.path.join(codex_home, "config.toml"), "w") as f:
                f.write(f"model = \"gpt-5-codex\"\n{provider}"
                        f"check_for_update_on_startup = false\n{limit}\n"
                        "[analytics]\nenabled = false\n\n"
                        "[model_providers.harness]\nname = \"harness\"\n"
                        f"base_url = \"{base}/v1\"\nwire_api = \"responses\"\nenv_key = \"HARNESS_API_KEY\"\n")
            env.update(CODEX_HOME=codex_home, HARNESS_API_KEY="sk-fake-harness-key")
        elif name == "opencode":
            cfg_dir = os.path.join(self.home, ".config", "opencode")
            os.makedirs(cfg_dir)
            context = self.args.agent_compact_tokens * 2 if self.args.agent_compact_tokens else 400000
            cfg = {
                "$schema": "https://opencode.ai/config.json",
                "model": "harness/fake-model", "share": "disabled", "autoupdate": False,
                "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny", "external_directory": "allow"},
                "provider": {"harness": {
                    "npm": "@ai-sdk/openai-compatible", "name": "Harness",
                    "options": {"baseURL": f"{base}/v1", "apiKey": "sk-fake-harness-key"},
                    "models": {"fake-model": {"name": "Fake model", "tool_call": True,
                                              "limit": {"context": context, "output": 8000}}}}},
            }
            with open(os.path.join(cfg_dir, "opencode.json"), "w") as f:
                json.dump(cfg, f, indent=1)
            env.update(OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1",
                       OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1",
                       OPENCODE_DISABLE_DEFAULT_PLUGINS="1")
        return env

    def client_commands(self):
        program, _, extra = CLIENTS[self.client]
        if program == "claude":
            cmds = [["claude", "-p", PROMPT, "--dangerously-skip-permissions", "--output-format", "text"] + extra]
            if self.args.agent_compaction:
                cmds.append(["claude", "-p", "/compact", "--continue", "--dangerously-skip-permissions",
                             "--output-format", "text"] + extra)
            return cmds
        if program == "codex":
            return [["codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", PROMPT]]
        return [["opencode", "run", PROMPT]]

    def drive(self):
        base = self.start_servers()
        env = self.client_env(base)
        started = time.time()
        rc = 0
        for n, cmd in enumerate(self.client_commands()):
            out = os.path.join(self.dir, f"client-{n}.log")
            with open(out, "w") as f:
                p = subprocess.Popen([os.path.join(BIN, cmd[0])] + cmd[1:], cwd=self.args.tree, env=env,
                                     stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
                self.procs.append(p)
                try:
                    rc = rc or p.wait(self.args.timeout)
                except subprocess.TimeoutExpired:
                    rc = "timeout"
                    break
        seconds = round(time.time() - started, 1)
        time.sleep(0.3)  # let the recorders write their last entries
        self.stop()
        return rc, seconds


def read_log(path):
    entries = []
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            with open(os.path.join(path, name)) as f:
                entries.append(json.load(f))
    return entries


MODEL_PATHS = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


def is_model_request(e):
    path = e.get("path", "").split("?")[0]
    return e.get("method") == "POST" and path.endswith(MODEL_PATHS)


def summarise(run_dir):
    up = [e for e in read_log(os.path.join(run_dir, "upstream")) if is_model_request(e)]
    tap = [e for e in read_log(os.path.join(run_dir, "tap")) if is_model_request(e)]
    refused = collections.Counter(e.get("reason") for e in up if e.get("status") == 400)
    ok = [e for e in up if e.get("status") == 200]
    main = [e for e in ok if e.get("kind") in ("tool-call", "final")]
    followers = [e for e in main if not e["bill"]["first"]]
    statuses = collections.Counter()
    for e in tap:
        s = e.get("compaction", {}).get("x-compaction-status", "none")
        statuses["skipped" if s.startswith("skipped") else s] += 1
    skip_reasons = collections.Counter(e["compaction"]["x-compaction-status"] for e in tap
                                       if e.get("compaction", {}).get("x-compaction-status", "").startswith("skipped"))
    return {
        "requests": len(up),
        "refused": sum(refused.values()),
        "refused_by_reason": dict(refused),
        "errors": sum(1 for e in up if e.get("status", 0) >= 500),
        "turns": max([e.get("turn", 0) for e in main] or [0]),
        "agent_compactions": sum(1 for e in ok if e.get("kind") == "agent-compaction"),
        "compacted": statuses.get("compacted", 0),
        "unchanged": statuses.get("unchanged", 0),
        "skipped": statuses.get("skipped", 0),
        "skip_reasons": dict(skip_reasons),
        "budget_missed": sum(1 for e in tap if e.get("compaction", {}).get("x-compaction-budget-met") == "false"),
        "billed": round(sum(e["bill"]["billed"] for e in ok), 1),
        "input_tokens": sum(e["bill"]["input_tokens"] for e in ok),
        "extends": sum(1 for e in followers if e["bill"]["extends"]),
        "follow_turns": len(followers),
        "dropped_thinking": sum(e.get("dropped_thinking", 0) for e in ok),
        # --recall: the model's compaction_recall calls (which the proxy
        # answers itself) and its answers from what came back
        "recall_calls": [e.get("recall_ids") for e in ok if e.get("kind") == "recall-call"],
        "recall_answers": sum(1 for e in ok if e.get("kind") == "recall-answer"),
        "recall_rounds": sum(int(e.get("compaction", {}).get("x-compaction-recall-rounds", 0)) for e in tap),
        "recalled_ids": [e["compaction"]["x-compaction-recalled-ids"] for e in tap
                         if "x-compaction-recalled-ids" in e.get("compaction", {})],
    }


def table(results):
    head = ("| client | mode | requests | refused (why) | compacted / unchanged / skipped | billed input | "
            "vs no proxy | turns extending previous | budget missed |")
    lines = [head, "|" + "---|" * 9]
    for client in dict.fromkeys(r["client"] for r in results):
        rows = [r for r in results if r["client"] == client]
        base = next((r["billed"] for r in rows if r["mode"] == "none"), None)
        for r in rows:
            why = ", ".join(f"{k} {v}" for k, v in sorted(r["refused_by_reason"].items()))
            statuses = "-" if r["mode"] == "none" else f"{r['compacted']} / {r['unchanged']} / {r['skipped']}"
            if r["skip_reasons"]:
                statuses += " (" + ", ".join(f"{k} {v}" for k, v in r["skip_reasons"].items()) + ")"
            ratio = f"{r['billed'] / base:.2f}x" if base else "-"
            ext = f"{r['extends']}/{r['follow_turns']}" if r["follow_turns"] else "-"
            if r["follow_turns"]:
                ext += f" ({r['extends'] / r['follow_turns']:.2f})"
            note = "" if r["rc"] == 0 else f" (client exit {r['rc']})"
            lines.append(f"| {client}{note} | {r['mode']} | {r['requests']} | {r['refused']}"
                         f"{' (' + why + ')' if why else ''} | {statuses} | {r['billed']:.0f} | {ratio} | {ext} | "
                         f"{'-' if r['mode'] == 'none' else r['budget_missed']} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description="Drive coding agents through compaction-proxy.")
    p.add_argument("--clients", default="claude,claude-sonnet,codex,opencode",
                   help=f"of {','.join(CLIENTS)}")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--turns", type=int, default=50, help="tool-call turns per session")
    p.add_argument("--budget", type=int, default=60000, help="budget_chars of the proxy's policy")
    p.add_argument("--proxy", default=None, help="compaction-proxy binary (default: target/release, then debug)")
    p.add_argument("--work", default=None, help="scratch directory (default: a new temp dir)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per client run")
    p.add_argument("--agent-compaction", action="store_true",
                   help="also make the agents compact their own history (Claude Code /compact after the session)")
    p.add_argument("--agent-compact-tokens", type=int, default=0,
                   help="Codex model_auto_compact_token_limit; opencode context limit = 2x this (0: off)")
    p.add_argument("--recall", nargs="?", const="end", default=None, choices=["end", "continue"],
                   help="recall = true on the proxy's policy; the fake model reads a file holding a secret token "
                        "first and, once the proxy cut it, recalls it with compaction_recall and answers with "
                        "the token (Claude Code: the Messages API); --recall continue: the session goes on "
                        "with its script after the recall")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    args.work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="agents-"))
    os.makedirs(args.work, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    args.proxy = find_proxy(args.proxy)
    if any(m != "none" for m in modes) and not args.proxy:
        sys.exit("no compaction-proxy binary: cargo build --release, or pass --proxy")
    # The tree the agents inspect (TREE), at one fixed path so that every
    # mode sees the same tool output.
    args.tree = os.path.join(args.work, "tree")
    args.secret = "VAULT-TOKEN-" + os.urandom(6).hex().upper()
    results = []
    for client in [c for c in args.clients.split(",") if c]:
        if not installed(CLIENTS[client][0]):
            print(f"{client}: skipped (not installed: run `npm ci` in scripts/agents)", flush=True)
            continue
        for mode in modes:
            shutil.rmtree(args.tree, ignore_errors=True)
            with tarfile.open(TREE, "r:xz") as tree:
                # Our own archive; the filter (where Python has it) still
                # keeps every path inside the tree.
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tree.extractall(args.tree, **safe)
            if args.recall:
                write_recall_file(args.tree, args.secret)
            run = Run(args, client, mode)
            try:
                rc, seconds = run.drive()
            finally:
                run.stop()
            row = dict(client=client, mode=mode, rc=rc, seconds=seconds, dir=run.dir, **summarise(run.dir))
            results.append(row)
            print(f"{client} {mode}: {row['requests']} requests, {row['refused']} refused, "
                  f"{row['compacted']} compacted, billed {row['billed']:.0f}, {seconds}s, exit {rc}", flush=True)
    print()
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"turns": args.turns, "budget": args.budget, "results": results,
                       "secret": args.secret if args.recall else None}, f, indent=1)
    print(f"\nlogs: {args.work}")


if __name__ == "__main__":
    main()
