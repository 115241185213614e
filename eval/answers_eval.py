"""`dsqa eval answers`: ask a running service over HTTP, score retrieval with eval/metrics.py (the
one rule), run the snippets it returned, and write results.jsonl, summary.json and report.html
(self-contained: inline SVG plots, no scripts, no CDN).
"""

from __future__ import annotations

import html
import json
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from eval.metrics import Question, Scored, load_questions, score_question, summarise
from eval.runner import RUNNABLE_KINDS, RunRequest, RunResult, SnippetRunner


def _ask(url: str, q: Question, k: int, timeout_s: float) -> tuple[dict[str, Any] | None, float, str]:
    t0 = time.perf_counter()
    try:
        r = httpx.post(url, json={"question": q.question, "k": k}, timeout=timeout_s)
        ms = (time.perf_counter() - t0) * 1000
        if r.status_code != 200:
            return None, ms, f"HTTP {r.status_code}: {r.text[:200]}"
        return r.json(), ms, ""
    except httpx.HTTPError as exc:
        return None, (time.perf_counter() - t0) * 1000, f"{type(exc).__name__}: {exc}"


def percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    xs = sorted(values)

    def p(q: float) -> float:
        i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
        return round(xs[i], 1)

    return {"p50": p(0.5), "p90": p(0.9), "p95": p(0.95), "p99": p(0.99), "max": round(xs[-1], 1), "mean": round(statistics.fmean(xs), 1)}


def run_answers_eval(
    questions_file: Path,
    url: str,
    runner: SnippetRunner,
    out_dir: Path,
    *,
    concurrency: int = 2,
    k: int = 10,
    timeout_s: float = 60.0,
    snippet_timeout_s: float = 180.0,
    memory_mb: int = 6144,
) -> dict[str, Any]:
    questions = load_questions(questions_file)
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        replies = list(pool.map(lambda q: _ask(url, q, k, timeout_s), questions))
    rows: list[dict[str, Any]] = []
    scored: list[Scored] = []
    to_run: dict[str, RunRequest] = {}
    for q, (body, ms, error) in zip(questions, replies, strict=True):
        passages = body.get("passages", []) if body else []
        snippets = body.get("snippets", []) if body else []
        top5 = {p.get("id") for p in passages[:5]}
        # the same rule as `dsqa eval retrieval`: snippet codes of the top 5 passages count for mentions
        codes = [s.get("code", "") for s in snippets if not s.get("chunk_id") or s.get("chunk_id") in top5]
        sc = score_question(q, [p.get("text", "") for p in passages], codes)
        scored.append(sc)
        for s in snippets:
            if s.get("kind") in RUNNABLE_KINDS and s.get("id") not in to_run:
                to_run[s["id"]] = RunRequest(kind=s["kind"], code=s["code"], id=s["id"], requires=tuple(s.get("requires") or ()),
                                             timeout_s=snippet_timeout_s, memory_mb=memory_mb)
        rows.append({
            "id": q.id, "question": q.question, "lang": q.lang, "topic": q.topic, "latency_ms": round(ms, 1), "error": error,
            "covered": body.get("covered") if body else None, "first_relevant": sc.first_relevant,
            "ndcg10": round(sc.ndcg10, 4), "mention_share": round(sc.mention_share, 4),
            "passages": [p.get("url") for p in passages], "snippet_ids": [s.get("id") for s in snippets],
        })
    results = runner.run_many(list(to_run.values()), concurrency=concurrency) if to_run else []
    by_id: dict[str, RunResult] = {r.id: r for r in results}
    for row in rows:
        row["snippet_runs"] = [
            {"id": sid, "kind": by_id[sid].kind, "status": by_id[sid].status, "reason": by_id[sid].reason[:300]}
            for sid in row["snippet_ids"] if sid in by_id
        ]
    summary = build_summary(rows, scored, results)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "results.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False), encoding="utf-8")
    (out_dir / "report.html").write_text(render_report(summary, rows), encoding="utf-8")
    return summary


def build_summary(rows: list[dict[str, Any]], scored: list[Scored], results: list[RunResult]) -> dict[str, Any]:
    retrieval = summarise(scored)
    by_topic: dict[str, Any] = {}
    for topic in sorted({s.topic or "(none)" for s in scored}):
        block = summarise([s for s in scored if (s.topic or "(none)") == topic])["all"]
        by_topic[topic] = block
    kinds: dict[str, dict[str, Any]] = {}
    for r in results:
        k = kinds.setdefault(r.kind, {"n": 0, "passed": 0, "failed": 0, "timeout": 0, "killed": 0, "skipped": 0})
        k["n"] += 1
        k[r.status] = k.get(r.status, 0) + 1
    for k in kinds.values():
        ran = k["n"] - k["skipped"]
        k["pass_rate"] = round(k["passed"] / ran, 4) if ran else None
    ran_all = [r for r in results if r.status != "skipped"]
    return {
        "questions": len(rows),
        "errors": sum(1 for r in rows if r["error"]),
        "retrieval": retrieval,
        "by_topic": by_topic,
        "snippets": {
            "total": len(results),
            "by_status": {s: sum(1 for r in results if r.status == s) for s in ("passed", "failed", "timeout", "killed", "skipped")},
            "pass_rate": round(sum(r.status == "passed" for r in ran_all) / len(ran_all), 4) if ran_all else None,
            "by_kind": kinds,
        },
        "latency_ms": percentiles([r["latency_ms"] for r in rows if not r["error"]]),
    }


# ---------------------------------------------------------------------------- report

def svg_bars(title: str, items: list[tuple[str, float]], *, max_value: float = 1.0, fmt: str = "{:.2f}", width: int = 560) -> str:
    """A horizontal bar chart as inline SVG."""
    bar_h, gap, label_w = 18, 6, 150
    h = 30 + len(items) * (bar_h + gap)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img" aria-label="{html.escape(title)}">',
             f'<text x="0" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    scale = (width - label_w - 60) / (max_value or 1.0)
    for i, (label, value) in enumerate(items):
        y = 28 + i * (bar_h + gap)
        w = max(0.0, value) * scale
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" font-size="12" text-anchor="end">{html.escape(label[:22])}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="#4c78a8"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 13}" font-size="12">{html.escape(fmt.format(value))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_histogram(title: str, values: list[float], *, bins: int = 12, width: int = 560, height: int = 200) -> str:
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 50}" role="img" aria-label="{html.escape(title)}">',
             f'<text x="0" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    if values:
        lo, hi = min(values), max(values)
        step = (hi - lo) / bins or 1.0
        counts = [0] * bins
        for v in values:
            counts[min(bins - 1, int((v - lo) / step))] += 1
        top = max(counts) or 1
        bw = (width - 40) / bins
        for i, c in enumerate(counts):
            bh = c / top * (height - 20)
            x = 30 + i * bw
            parts.append(f'<rect x="{x:.1f}" y="{24 + height - 20 - bh:.1f}" width="{bw - 2:.1f}" height="{bh:.1f}" fill="#f58518"><title>{c}</title></rect>')
            if c:
                parts.append(f'<text x="{x + bw / 2:.1f}" y="{20 + height - 20 - bh:.1f}" font-size="10" text-anchor="middle">{c}</text>')
        parts.append(f'<text x="30" y="{height + 20}" font-size="11">{lo:.0f} ms</text>')
        parts.append(f'<text x="{width - 10}" y="{height + 20}" font-size="11" text-anchor="end">{hi:.0f} ms</text>')
    else:
        parts.append('<text x="0" y="40" font-size="12">no latencies</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_report(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    r = summary["retrieval"]
    langs = [(lang, float(b.get("hit@5", 0))) for lang, b in r.items() if isinstance(b, dict) and "hit@5" in b and lang != "all"]
    topics = [(t, float(b.get("hit@5", 0))) for t, b in summary["by_topic"].items() if "hit@5" in b]
    kinds = [(k, float(v["pass_rate"] or 0.0)) for k, v in summary["snippets"]["by_kind"].items()]
    allb = r.get("all", {})
    metrics = "".join(f"<tr><td>{html.escape(m)}</td><td>{allb.get(m)}</td></tr>" for m in ("n", "hit@1", "hit@5", "hit@10", "mrr@10", "ndcg@10", "mention_share"))
    lat = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in summary["latency_ms"].items())
    table = "".join(
        f"<tr><td>{html.escape(str(x['id']))}</td><td>{html.escape(x['question'][:90])}</td><td>{html.escape(x['lang'])}</td>"
        f"<td>{html.escape(x['topic'])}</td><td>{x['first_relevant'] or '-'}</td><td>{x['latency_ms']}</td>"
        f"<td>{', '.join(html.escape(s['status']) for s in x.get('snippet_runs', [])) or '-'}</td></tr>"
        for x in rows
    )
    charts = [
        svg_bars("hit@5 by language", langs),
        svg_bars("hit@5 by topic", topics),
        svg_bars("snippet pass rate by kind (of those run)", kinds),
        svg_histogram("answer latency (ms)", [x["latency_ms"] for x in rows if not x["error"]]),
    ]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dsqa answer evaluation</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}}figure{{margin:1em 0}}</style></head>
<body><h1>dsqa answer evaluation</h1>
<p>{summary['questions']} questions, {summary['errors']} errors; {summary['snippets']['total']} snippets run
({html.escape(json.dumps(summary['snippets']['by_status']))}), pass rate {summary['snippets']['pass_rate']}.</p>
<h2>Retrieval (eval/metrics.py)</h2><table>{metrics}</table>
<h2>Latency (ms)</h2><table>{lat}</table>
{''.join(f'<figure>{c}</figure>' for c in charts)}
<h2>Questions</h2><table><tr><th>id</th><th>question</th><th>lang</th><th>topic</th><th>first relevant</th><th>ms</th><th>snippet runs</th></tr>{table}</table>
</body></html>
"""
