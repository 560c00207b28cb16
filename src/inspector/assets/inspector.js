// The compaction-proxy inspector. Every text from a request goes into the
// page with textContent (or as a text node): message contents are data,
// never markup. The Content-Security-Policy forbids inline script besides.
"use strict";

(function () {
  const TOKEN_KEY = "compaction-proxy-inspector-token";
  const POLL_MS = 2000;
  const FOLD_CHARS = 600;
  const FOLD_REMOVED_CHARS = 120;
  const MARKS = ["kept", "trimmed", "pruned", "deduplicated", "dropped", "summarized", "marker", "recalled"];

  const $ = (id) => document.getElementById(id);
  let selected = null;
  let timer = null;
  let lastList = [];

  // An element with a class and children; strings become text nodes.
  function el(tag, cls, ...children) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  async function api(path) {
    const headers = { Accept: "application/json" };
    if (token()) headers.Authorization = "Bearer " + token();
    const response = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    if (response.status === 401) {
      notice("This inspector requires its bearer token: enter it above.", true);
      return null;
    }
    if (!response.ok) {
      notice("The inspector answered " + response.status + ".", true);
      return null;
    }
    notice(null);
    return response.json();
  }

  function notice(text, isError) {
    const box = $("notice");
    box.hidden = !text;
    box.textContent = text || "";
    box.classList.toggle("error", Boolean(isError));
  }

  const fmt = (n) => (n === null || n === undefined ? "?" : Number(n).toLocaleString("en-US"));

  function beforeAfter(before, after) {
    if (before === null || before === undefined) return el("span", "dim", "\u2014");
    const cell = el("span", null, fmt(before) + " \u2192 " + fmt(after));
    if (before > 0 && after !== null && after !== undefined && after < before) {
      const pct = Math.round((1 - after / before) * 100);
      cell.append(el("span", "pct", " \u2212" + pct + "%"));
    }
    return cell;
  }

  function usageText(usage) {
    if (!usage) return el("span", "dim", "\u2014");
    const parts = [];
    parts.push("in " + fmt(usage.uncached_input_tokens));
    const cache = [];
    if (usage.cache_read_input_tokens !== null && usage.cache_read_input_tokens !== undefined)
      cache.push(fmt(usage.cache_read_input_tokens) + " read");
    if (usage.cache_write_input_tokens !== null && usage.cache_write_input_tokens !== undefined)
      cache.push(fmt(usage.cache_write_input_tokens) + " written");
    if (cache.length) parts.push("cache " + cache.join(", "));
    parts.push("out " + fmt(usage.output_tokens));
    if (usage.cost !== null && usage.cost !== undefined) parts.push("cost " + usage.cost.toFixed(4));
    return el("span", null, parts.join(" \u00b7 "));
  }

  // The list's short form: all input tokens, the cached share, output.
  function usageShort(usage) {
    if (!usage) return el("span", "dim", "\u2014");
    const known = (n) => n !== null && n !== undefined;
    const parts = [];
    if (known(usage.uncached_input_tokens)) {
      const read = usage.cache_read_input_tokens || 0;
      const input = usage.uncached_input_tokens + read + (usage.cache_write_input_tokens || 0);
      parts.push(fmt(input) + " in");
      if (known(usage.cache_read_input_tokens) && input > 0) parts.push(Math.round((read / input) * 100) + "% cached");
    } else {
      parts.push("? in");
    }
    parts.push(fmt(usage.output_tokens) + " out");
    const cell = el("span", null, parts.join(" \u00b7 "));
    cell.title = usageText(usage).textContent;
    return cell;
  }

  function savingText(saving) {
    if (!saving) return el("span", "dim", "\u2014");
    const parts = [];
    if (saving.input_tokens !== null && saving.input_tokens !== undefined)
      parts.push((saving.input_tokens >= 0 ? "+" : "") + fmt(saving.input_tokens) + " tok");
    if (saving.cost !== null && saving.cost !== undefined)
      parts.push((saving.cost >= 0 ? "+" : "") + saving.cost.toFixed(4));
    const negative = (saving.input_tokens || 0) < 0 || (saving.cost || 0) < 0;
    return el("span", negative ? "negative" : "positive", parts.join(" \u00b7 ") || "?");
  }

  function statusBadge(summary) {
    return el("span", "badge status-" + summary.status_label, summary.status);
  }

  function query() {
    const params = new URLSearchParams();
    for (const key of ["tenant", "policy", "status"]) {
      const value = $("f-" + key).value;
      if (value) params.set(key, value);
    }
    return params.toString();
  }

  function fillSelect(select, values) {
    const current = select.value;
    const wanted = ["", ...values];
    const have = Array.from(select.options).map((o) => o.value);
    if (select.id !== "f-status" && wanted.join("\u0000") !== have.join("\u0000")) {
      select.replaceChildren(...wanted.map((v) => {
        const option = el("option", null, v || "all");
        option.value = v;
        return option;
      }));
      if (wanted.includes(current)) select.value = current;
    }
  }

  async function loadList() {
    const q = query();
    const data = await api("/inspector/api/requests" + (q ? "?" + q : ""));
    if (!data) return;
    fillSelect($("f-tenant"), data.tenants);
    fillSelect($("f-policy"), data.policies);
    lastList = data.requests;
    const rows = data.requests.map((r) => {
      const tr = el(
        "tr",
        r.id === selected ? "selected" : null,
        el("td", "time", new Date(r.time_ms).toLocaleTimeString("en-GB")),
        el("td", "mono", r.route),
        el("td", null, r.tenant),
        el("td", null, r.policy),
        el("td", null, statusBadge(r)),
        el("td", "num", r.http_status === null ? "\u2026" : String(r.http_status)),
        el("td", "num", beforeAfter(r.loss && r.loss.input_chars, r.loss && r.loss.output_chars)),
        el("td", "num", beforeAfter(r.loss && r.loss.input_tokens, r.loss && r.loss.output_tokens)),
        el("td", "num", usageShort(r.usage)),
        el("td", "num", savingText(r.estimated_saving)),
      );
      tr.dataset.id = r.id;
      tr.tabIndex = 0;
      tr.addEventListener("click", () => select(r.id));
      tr.addEventListener("keydown", (e) => {
        if (e.key === "Enter") select(r.id);
      });
      return tr;
    });
    $("request-rows").replaceChildren(...rows);
    $("empty").hidden = rows.length > 0;
    if (selected) {
      const line = lastList.find((r) => r.id === selected);
      if (line && line.pending) loadDetail(selected);
    }
  }

  function select(id) {
    if (location.hash !== "#" + id) history.replaceState(null, "", "#" + id);
    selected = id;
    for (const tr of document.querySelectorAll("#request-rows tr")) {
      tr.classList.toggle("selected", tr.dataset.id === id);
    }
    loadDetail(id);
  }

  // A message's text: folded behind its first lines when long.
  function textBlock(text, foldAt) {
    const pre = el("pre", "text", text);
    if (text.length <= (foldAt || FOLD_CHARS)) return pre;
    const details = el("details", "fold");
    const head = text.slice(0, 160).replace(/\s+/g, " ");
    details.append(el("summary", null, head + "\u2026 ", el("span", "dim", "(" + fmt(text.length) + " chars: show all)")), pre);
    return details;
  }

  function sideCell(side, cls, removed) {
    const cell = el("div", "cell " + cls);
    if (!side) {
      cell.append(el("div", "absent", cls === "forwarded" ? "not forwarded" : "not in the request"));
      return cell;
    }
    cell.append(el("div", "meta", el("span", "role role-" + side.role, side.role), el("span", "dim", fmt(side.chars) + " chars")));
    // What was removed folds sooner: the forwarded side is what matters.
    if (side.text) cell.append(textBlock(side.text, removed ? FOLD_REMOVED_CHARS : FOLD_CHARS));
    for (const call of side.tool_calls || []) {
      cell.append(el("div", "call", el("span", "call-name", "\u2192 " + call.name + "(\u2026)"), textBlock(call.arguments)));
    }
    return cell;
  }

  function markCell(row) {
    const cell = el("div", "cell mark");
    cell.append(el("span", "badge mark-" + row.mark, row.mark));
    if (row.stage) cell.append(el("span", "stage", row.stage));
    if (row.index !== null && row.index !== undefined) cell.append(el("span", "dim idx", "#" + row.index));
    if (row.reason) cell.append(el("div", "reason", row.reason));
    if (row.recall_id) {
      const recall = el("div", "reason recall-id", (row.index === null || row.index === undefined ? "marker " : "recall id ") + row.recall_id);
      if (row.recalled) recall.append(el("strong", null, " \u2014 recalled by the model"));
      cell.append(recall);
    }
    if (row.decision) cell.append(el("div", "reason", "tool result: " + row.decision));
    for (const call of row.tool_calls || []) {
      cell.append(el("div", "reason", "call " + call.name + ": " + call.decision + (call.arguments_clipped ? " (arguments clipped)" : "")));
    }
    return cell;
  }

  async function loadDetail(id) {
    const data = await api("/inspector/api/requests/" + encodeURIComponent(id));
    if (!data || id !== selected) return;
    const r = data.request;
    const view = data.view;
    $("detail").hidden = false;
    $("detail-title").replaceChildren(el("span", "mono", r.route), " ", statusBadge(r), el("span", "dim id", r.id));
    const facts = [
      ["time", new Date(r.time_ms).toLocaleString("en-GB")],
      ["tenant", r.tenant],
      ["policy", r.policy],
      ["format", r.format],
    ];
    if (r.loss) {
      facts.push(["messages", fmt(r.loss.input_messages) + " \u2192 " + fmt(r.loss.output_messages)]);
      facts.push(["chars", fmt(r.loss.input_chars) + " \u2192 " + fmt(r.loss.output_chars)]);
      if (r.loss.input_tokens !== null) facts.push(["tokens", fmt(r.loss.input_tokens) + " \u2192 " + fmt(r.loss.output_tokens)]);
    }
    $("detail-facts").replaceChildren(...facts.map(([k, v]) => el("span", "fact", el("span", "dim", k + " "), v)),
      el("span", "fact", el("span", "dim", "billed "), usageText(r.usage)),
      el("span", "fact", el("span", "dim", "saving "), savingText(r.estimated_saving)));
    const conversation = $("conversation");
    if (!view) {
      conversation.replaceChildren(el("p", "empty", "The side-by-side view is being computed\u2026"));
      return;
    }
    if (view.unavailable) {
      conversation.replaceChildren(el("p", "empty", "No side-by-side view: " + view.unavailable));
      return;
    }
    const counts = {};
    for (const row of view.rows) counts[row.mark] = (counts[row.mark] || 0) + 1;
    $("legend").replaceChildren(...MARKS.filter((m) => counts[m]).map((m) => el("span", "badge mark-" + m, m + " " + counts[m])));
    if (r.status_label === "dry-run") {
      $("legend").append(el("span", "dim", "dry run: the upstream got the original; the right side shows what compaction would forward"));
    }
    const summaries = $("summaries");
    summaries.hidden = !(view.summaries && view.summaries.length);
    summaries.replaceChildren(...(view.summaries || []).map((s) => el("div", "summary", el("strong", null, "summary "), textBlock(s))));
    const nodes = [];
    view.rows.forEach((row, i) => {
      if (view.stable && view.stable.boundary_row === i) nodes.push(boundary(view.stable));
      const div = el("div", "row mark-row-" + row.mark, sideCell(row.original, "original", !row.forwarded), markCell(row), sideCell(row.forwarded, "forwarded", false));
      div.dataset.mark = row.mark;
      if (row.fate) div.dataset.fate = row.fate;
      if (row.index !== null && row.index !== undefined) div.dataset.index = String(row.index);
      if (row.recall_id) div.dataset.recallId = row.recall_id;
      if (row.recalled) div.dataset.recalled = "true";
      nodes.push(div);
    });
    if (view.stable && view.stable.boundary_row >= view.rows.length) nodes.push(boundary(view.stable));
    conversation.replaceChildren(...nodes);
  }

  function boundary(stable) {
    const line = el("div", "boundary", "stable prefix ends here: the " + fmt(stable.stable_messages) +
      " forwarded messages above are as the previous turn forwarded them" +
      (stable.rebased ? " (this turn re-compacted)" : ""));
    line.dataset.stableMessages = String(stable.stable_messages);
    return line;
  }

  function setLive(on) {
    if (timer) clearInterval(timer);
    timer = on ? setInterval(loadList, POLL_MS) : null;
  }

  $("live").addEventListener("change", (e) => setLive(e.target.checked));
  $("refresh").addEventListener("click", () => {
    loadList();
    if (selected) loadDetail(selected);
  });
  for (const key of ["tenant", "policy", "status"]) $("f-" + key).addEventListener("change", loadList);
  $("filters").addEventListener("submit", (e) => e.preventDefault());
  $("auth").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("token").value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    loadList();
    if (selected) loadDetail(selected);
  });
  window.addEventListener("hashchange", () => {
    const id = location.hash.slice(1);
    if (id && id !== selected) select(id);
  });

  loadList().then(() => {
    const id = location.hash.slice(1);
    if (id) select(id);
  });
})();
