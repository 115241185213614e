// dsqa web page: POST /ask, POST /validate-config, POST /plan, GET /readyz. All text goes in through textContent.
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function show(node, on) { node.hidden = !on; }

async function callJson(url, body) {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  let data = null;
  try { data = await r.json(); } catch (e) { /* not JSON */ }
  if (!r.ok) {
    const msg = data && data.message ? data.message : `the service answered ${r.status}`;
    throw new Error(msg);
  }
  return data;
}

async function loadStatus() {
  const pill = $("index-status");
  try {
    const r = await fetch("/readyz");
    const data = await r.json();
    if (r.ok) {
      const idx = data.index || {};
      const counts = idx.counts || {};
      pill.textContent = `deepspeed ${idx.deepspeed_version || "?"} · ${counts.chunks ?? "?"} passages · ${counts.snippets ?? "?"} snippets`;
    } else {
      pill.textContent = "index not loaded";
    }
  } catch (e) {
    pill.textContent = "service unreachable";
  }
}

// The answer with its [n] citations turned into links to the passages below.
function renderAnswer(text, passages) {
  const box = $("answer");
  box.replaceChildren();
  const parts = text.split(/(\[\d+\])/);
  for (const part of parts) {
    const m = part.match(/^\[(\d+)\]$/);
    const n = m ? Number(m[1]) : 0;
    if (m && n >= 1 && n <= passages.length) {
      box.append(el("a", { class: "cite", href: `#passage-${n}`, title: passages[n - 1].title, text: part }));
    } else {
      box.append(document.createTextNode(part));
    }
  }
}

// Passage text with its ``` fenced code shown as code blocks and the "### heading" line that opens a part
// from a neighbouring section as a heading (`PART_OPENER` in app/retriever.py; text only, never HTML).
function passageBody(text) {
  const body = el("div", { class: "text" });
  text.split(/```[\w-]*\n?/).forEach((part, i) => {
    if (!part.trim()) return;
    if (i % 2) {
      body.append(el("pre", {}, el("code", { text: part.replace(/\n$/, "") })));
      return;
    }
    part.split(/^### (.*)$/m).forEach((piece, j) => {
      if (j % 2) body.append(el("h4", { class: "part", text: piece.trim() }));
      else if (piece.trim()) body.append(el("p", { text: piece.trim() }));
    });
  });
  return body;
}

function renderPassages(passages) {
  const list = $("passages");
  list.replaceChildren();
  passages.forEach((p, i) => {
    const where = p.heading && p.heading !== p.title ? `${p.title} › ${p.heading}` : p.title;
    const text = p.text.length > 700 ? p.text.slice(0, 700) + " …" : p.text;
    list.append(el("li", { id: `passage-${i + 1}` },
      el("a", { class: "where", href: p.url, target: "_blank", rel: "noopener", text: where }),
      el("span", { class: "meta", text: `${p.source} · score ${p.score}` }),
      passageBody(text)));
  });
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = el("textarea");
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

function renderSnippets(snippets) {
  const box = $("snippets");
  box.replaceChildren();
  show($("no-snippets"), snippets.length === 0);
  // checked ones first, as the other front ends do
  const good = (s) => ({ ran: 0, checked: 1, template: 2, not_checked: 3, fails: 4 }[s.status] ?? 3);
  const ordered = [...snippets].sort((a, b) => good(a) - good(b));
  for (const s of ordered) {
    const button = el("button", { class: "small copy", type: "button", text: "Copy" });
    button.addEventListener("click", async () => {
      try { await copyText(s.code); button.textContent = "Copied"; }
      catch (e) { button.textContent = "Copy failed"; }
      setTimeout(() => { button.textContent = "Copy"; }, 1500);
    });
    const head = el("div", { class: "head" },
      el("span", { class: `status ${s.status}`, text: s.label || s.status }),
      el("span", { text: `${s.kind} · ${s.language || "text"}` }),
      el("span", { class: "grow muted", title: s.reason || "", text: s.stamp || "" }),
      el("a", { href: s.source_url, target: "_blank", rel: "noopener", text: "source" }),
      button);
    box.append(el("div", { class: "snippet", "data-status": s.status, "data-id": s.id }, head,
      el("pre", {}, el("code", { text: s.code }))));
  }
}

async function onAsk(event) {
  event.preventDefault();
  const button = $("ask-button");
  const question = $("question").value.trim();
  if (!question) return;
  const body = { question, k: Number($("k").value), checked_only: $("checked-only").checked };
  const topic = $("topic").value.trim();
  if (topic) body.topic = topic;
  button.disabled = true;
  button.textContent = "Asking…";
  show($("ask-error"), false);
  try {
    const data = await callJson("/ask", body);
    renderAnswer(data.answer, data.passages);
    $("answer").classList.toggle("not-covered", !data.covered);
    renderPassages(data.passages);
    renderSnippets(data.snippets);
    $("timing").textContent = `${data.passages.length} passages · ${data.snippets.length} snippets · ${data.timings_ms.total} ms`;
    show($("result"), true);
  } catch (e) {
    $("ask-error").textContent = e.message;
    show($("ask-error"), true);
    show($("result"), false);
  } finally {
    button.disabled = false;
    button.textContent = "Ask";
  }
}

function renderValidation(result) {
  const box = $("validation");
  box.replaceChildren();
  const verdict = result.valid ? "valid" : "invalid";
  box.append(el("p", { class: `verdict ${verdict}`, text: `${verdict} — ${result.errors.length} error(s), ${result.warnings.length} warning(s)` }));
  const list = el("ul", { class: "findings" });
  for (const [kind, items] of [["error", result.errors], ["warning", result.warnings]]) {
    for (const f of items) {
      const li = el("li", { class: kind }, el("code", { text: f.pointer || "/" }), document.createTextNode(` ${f.message}`));
      if (f.suggestion) li.append(document.createTextNode(` (${f.suggestion})`));
      if (f.doc_url) li.append(document.createTextNode(" "), el("a", { href: f.doc_url, target: "_blank", rel: "noopener", text: "docs" }));
      list.append(li);
    }
  }
  box.append(list);
  show(box, true);
}

async function onValidate(event) {
  event.preventDefault();
  const button = $("validate-button");
  show($("validate-error"), false);
  let config;
  try {
    config = JSON.parse($("config").value);
  } catch (e) {
    $("validate-error").textContent = `not JSON: ${e.message}`;
    show($("validate-error"), true);
    return;
  }
  button.disabled = true;
  try {
    const size = Number($("world-size").value) || 1;
    renderValidation(await callJson(`/validate-config?world_size=${size}`, config));
  } catch (e) {
    $("validate-error").textContent = e.message;
    show($("validate-error"), true);
  } finally {
    button.disabled = false;
  }
}

function planRequest() {
  const body = {
    params: Number($("plan-params").value),
    gpus_per_node: Number($("plan-gpus").value),
    nodes: Number($("plan-nodes").value) || 1,
    gpu_mem_gb: Number($("plan-gpu-mem").value),
    seq_len: Number($("plan-seq").value) || 2048,
  };
  const optional = { gpu_kind: $("plan-gpu-kind").value.trim(), nvme: $("plan-nvme").value.trim() };
  for (const [k, v] of Object.entries(optional)) if (v) body[k] = v;
  for (const [k, id] of [["cpu_mem_gb", "plan-cpu-mem"], ["micro_batch", "plan-micro"], ["lora_share", "plan-lora"]]) {
    const v = $(id).value.trim();
    if (v) body[k] = Number(v);
  }
  return body;
}

function renderPlan(result) {
  const c = result.choice;
  const choice = $("plan-choice");
  choice.className = `verdict ${result.fits ? "valid" : "invalid"}`;
  choice.textContent = `${result.fits ? "plan" : "nothing fits; nearest"}: ZeRO stage ${c.stage}, optimizer offload ${c.offload_optimizer}, `
    + `parameter offload ${c.offload_param}, ${c.precision}, ${c.method} fine-tuning`;
  const body = $("plan-candidates").querySelector("tbody");
  body.replaceChildren(...result.candidates.map((x) => el("tr", { class: x.fits ? "fits" : "no" },
    el("td", { text: String(x.stage) }), el("td", { text: x.offload_optimizer }), el("td", { text: x.offload_param }),
    el("td", { text: x.per_gpu_gb.toFixed(1) }), el("td", { text: x.per_node_cpu_gb.toFixed(1) }),
    el("td", { text: x.fits ? "yes" : `no: ${x.why_not}` }))));
  $("plan-reasons").replaceChildren(...result.reasons.map((r) => {
    const li = el("li", { text: r.text });
    if (r.url) li.append(document.createTextNode(" "), el("a", { href: r.url, target: "_blank", rel: "noopener", text: "docs" }));
    return li;
  }));
  $("plan-validated").textContent = result.validated.valid ? "(validated against the installed deepspeed)" : "(the validator found problems)";
  $("plan-config").textContent = JSON.stringify(result.config, null, 2);
  show($("plan"), true);
}

async function onPlan(event) {
  event.preventDefault();
  const button = $("plan-button");
  show($("plan-error"), false);
  button.disabled = true;
  try {
    renderPlan(await callJson("/plan", planRequest()));
  } catch (e) {
    $("plan-error").textContent = e.message;
    show($("plan-error"), true);
    show($("plan"), false);
  } finally {
    button.disabled = false;
  }
}

$("ask-form").addEventListener("submit", onAsk);
$("plan-form").addEventListener("submit", onPlan);
$("validate-form").addEventListener("submit", onValidate);
$("question").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask-form").requestSubmit(); }
});
loadStatus();
