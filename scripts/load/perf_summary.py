#!/usr/bin/env python3
"""Summarize a `perf record -g` profile of the proxy: where the time goes.

Prints the user/kernel split, the share of the kernel's scheduler and futex
paths (flat, by the symbol the sample was in), the shares of a few kernel
entry points with their callees (inclusive, from the kernel call chains), the
top symbols, and user time grouped by crate.

Usage: perf_summary.py perf.data [TOP_N]
"""

import re
import subprocess
import sys
from collections import defaultdict

# Kernel symbols of context switching, wake-ups and futexes: the price of
# handing work between threads.
SCHEDULER = re.compile(
    r"schedule|switch_to|switch_mm|finish_task_switch|try_to_wake_up|ttwu|wake_up|"
    r"futex|enqueue_|dequeue_|pick_next|update_curr|update_load|select_task_rq|"
    r"idle|psi_|cpuacct|set_next_entity|put_prev|check_preempt|resched|"
    r"native_sched_clock|sched_clock|hrtick|load_balance"
)
# Kernel entry points whose inclusive share tells what the syscalls cost.
ENTRY_POINTS = [
    "__schedule",
    "tokio::runtime::blocking::pool::Inner::run",
    "futex_wait",
    "futex_wake",
    "try_to_wake_up",
    "do_futex",
    "__x64_sys_futex",
    "__x64_sys_epoll_wait",
    "do_epoll_wait",
    "__x64_sys_write",
    "__x64_sys_writev",
    "__x64_sys_sendto",
    "__x64_sys_read",
    "__x64_sys_recvfrom",
    "tcp_sendmsg",
    "tcp_recvmsg",
    "ksys_write",
    "sock_def_readable",
]
ROW = re.compile(r"^\s*([\d.]+)%\s+(\S+)\s+\[([k.])\]\s+(.*?)\s*$")


def report(path, *args):
    out = subprocess.run(
        ["perf", "report", "-i", path, "--stdio", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout


def crate_of(symbol):
    s = symbol.lstrip("<_&* ")
    s = re.sub(r"^(dyn |impl )", "", s)
    head = re.split(r"::|<| as ", s, maxsplit=1)[0]
    if not head or head.startswith("0x"):
        return "(unresolved)"
    if "::" not in symbol:
        return "libc/other: " + head if len(head) < 40 else "libc/other"
    return head


def main():
    path = sys.argv[1]
    top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    flat = report(path, "--no-children", "--sort", "dso,sym", "-g", "none", "--percent-limit", "0")
    rows = []
    for line in flat.splitlines():
        m = ROW.match(line)
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3) == "k", m.group(4)))
    if not rows:
        print("perf report gave no samples")
        return
    total = sum(r[0] for r in rows)
    kernel = sum(r[0] for r in rows if r[2])
    sched = sum(r[0] for r in rows if r[2] and SCHEDULER.search(r[3]))
    print("## perf profile of compaction-proxy")
    print(f"samples: user {total - kernel:.1f}%, kernel {kernel:.1f}%")
    print(f"kernel scheduler / futex / wake-up symbols (flat): {sched:.1f}%")
    print(f"kernel, other (network stack, syscalls, memory): {kernel - sched:.1f}%")

    children = report(path, "--children", "--sort", "sym", "-g", "none", "--percent-limit", "0")
    inclusive = {}
    for line in children.splitlines():
        m = re.match(r"^\s*([\d.]+)%\s+([\d.]+)%\s+\[([k.])\]\s+(.*?)\s*$", line)
        if m:
            inclusive.setdefault(m.group(4), float(m.group(1)))
    shown = [(name, inclusive[name]) for name in ENTRY_POINTS if name in inclusive]
    if shown:
        print("inclusive (the symbol and what it calls; user call chains may be cut short):")
        for name, pct in sorted(shown, key=lambda kv: -kv[1]):
            print(f"  {pct:5.1f}%  {name}")

    print(f"\ntop {top_n} symbols (flat):")
    for pct, dso, is_kernel, sym in sorted(rows, reverse=True)[:top_n]:
        print(f"  {pct:5.1f}%  {'[k]' if is_kernel else '[.]'}  {sym[:110]}  ({dso})")

    groups = defaultdict(float)
    for pct, dso, is_kernel, sym in rows:
        if not is_kernel:
            groups[crate_of(sym)] += pct
    print("\nuser time by crate (flat):")
    for name, pct in sorted(groups.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {pct:5.1f}%  {name}")


if __name__ == "__main__":
    main()
