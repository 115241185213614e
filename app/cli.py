"""The `dsqa` command: thin sub-commands over the indexer, the `ask` core and the evaluators."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported anywhere
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from app.errors import DsqaError, InvalidInput, as_text  # noqa: E402
from app.settings import Settings, SettingsError, settings_from_env  # noqa: E402

if TYPE_CHECKING:
    from app.retriever import HybridRetriever

log = logging.getLogger("dsqa")


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def resolve_docs_dir(settings: Settings, explicit: Path | None, *, try_fetch: bool) -> tuple[Path | None, str]:
    """Docs to index: --docs, DSQA_DOCS_DIR, the fetched default, or a fetch now; else none."""
    from indexer.fetch import FetchError, current_docs_dir, fetch_docs

    if explicit is not None:
        return explicit, f"dir:{explicit}"
    if settings.docs_dir is not None:
        return settings.docs_dir, f"dir:{settings.docs_dir}"
    fetched = current_docs_dir(settings.cache_dir)
    if fetched is not None:
        return fetched, fetched.name
    if try_fetch:
        ref = settings.docs_ref or _default_ref()
        try:
            result = fetch_docs(settings.cache_dir, ref, settings.docs_url_template, timeout_s=settings.fetch_timeout_s, retries=settings.fetch_retries)
            return result.docs_dir, ref
        except FetchError as exc:
            print(f"dsqa: could not fetch DeepSpeed's docs ({exc}).", file=sys.stderr)
    return None, ""


def _default_ref() -> str:
    from indexer.config_catalogue import deepspeed_version

    return f"v{deepspeed_version()}"


def cmd_index(args: argparse.Namespace, settings: Settings) -> int:
    from indexer.build import build_index
    from indexer.embedder import SentenceTransformerEmbedder

    out = args.out or settings.index_dir
    docs_dir, ref = resolve_docs_dir(settings, args.docs, try_fetch=False)
    embedder = SentenceTransformerEmbedder(settings.embedding_model, bf16=None if settings.build_bf16 == "auto" else False)
    if args.quiet:  # nor the model loader's bar for its weights
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    report = build_index(
        out, embedder, docs_dir=docs_dir, notes_dir=settings.notes_dir, cache_dir=settings.cache_dir,
        docs_ref=ref or None, progress=not args.quiet, batch_size=settings.embed_batch_size,
    )
    if args.json:
        _print_json(report.to_json())
    else:
        print(f"indexed {report.chunks} chunks ({report.by_source}), {report.snippets} snippets, "
              f"embedded {report.embedded} new, in {report.seconds:.1f}s -> {report.path}")
    for line in report.missing:
        print(f"note: {line}", file=sys.stderr)
    return 0


def index_problem(settings: Settings) -> str | None:
    """Why the index cannot be served (damaged, or built with another model), or None."""
    from app.engine import load_engine
    from indexer.store import IndexError_

    try:
        load_engine(settings, strict=True)
    except IndexError_ as exc:
        return str(exc)
    return None


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from app.logs import configure_logging
    from indexer.index_folder import index_present  # not indexer.store: a supervisor never loads an index

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    # the app sees the real bind address (the MCP transport's DNS-rebinding guard depends on it)
    settings = settings.model_copy(update={"host": args.host or settings.host, "port": args.port or settings.port})
    configure_logging(json_lines=settings.log_json)
    if getattr(args, "workers", None):
        settings = settings.model_copy(update={"workers": args.workers})
    if settings.workers > 1:
        # a damaged index stops the start with one line, checked in a process that then exits: loaded
        # here, the engine's memory stayed with the supervisor (~190 MB) while each worker loads its own
        if index_present(settings.index_dir):
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
                problem = pool.submit(index_problem, settings).result()
            if problem:
                print(f"dsqa: {problem}", file=sys.stderr)
                return 3
        return serve_workers(settings)
    import uvicorn

    from app.api import create_app
    from app.engine import load_engine
    from app.http_protocol import server_config
    from indexer.store import IndexError_

    try:  # a damaged index stops the start with one line; a missing one starts not-ready (503 until built)
        engine = load_engine(settings, strict=True) if index_present(settings.index_dir) else None
    except IndexError_ as exc:
        print(f"dsqa: {exc}", file=sys.stderr)
        return 3
    uvicorn.Server(server_config(create_app(settings, engine), host=settings.host, port=settings.port,
                                 header_timeout_s=settings.header_timeout_s, access_log=not settings.log_json)).run()
    return 0


def serve_workers(settings: Settings) -> int:
    """Several uvicorn worker processes on one port, each loading the index itself: the Python part of
    an answer holds the GIL, so on N cores N processes answer about N times as many questions."""
    import uvicorn

    from app.http_protocol import EVENT_LOOP, HeaderDeadlineProtocol
    from indexer.index_folder import index_present

    env = {"DSQA_INDEX_DIR": str(Path(settings.index_dir).resolve()), "DSQA_HOST": settings.host, "DSQA_PORT": str(settings.port),
           "DSQA_WORKERS": str(settings.workers)}
    if "DSQA_ENCODER_THREADS" not in os.environ:  # one encoder thread per process: the processes share the cores
        env["DSQA_ENCODER_THREADS"] = "1"
    env["DSQA_VERIFY_IN_BACKGROUND"] = "false"  # one verify for all workers: run here, its ledger read by each
    os.environ.update(env)
    verifier = None
    if settings.verify_in_background and index_present(settings.index_dir):
        from app.background_verify import BackgroundVerify

        verifier = BackgroundVerify(Path(settings.index_dir), timeout_s=settings.verify_timeout_s)
        verifier.start()
    try:
        uvicorn.run("app.api:app_from_env", factory=True, workers=settings.workers, host=settings.host, port=settings.port,
                    http=HeaderDeadlineProtocol, loop=EVENT_LOOP, log_level="info", access_log=not settings.log_json)
    finally:
        if verifier is not None:
            verifier.stop()
    return 0


def cmd_mcp(args: argparse.Namespace, settings: Settings) -> int:
    """The MCP tools over stdio, for AI coding assistants that spawn the server themselves."""
    from app.mcp_server import serve_stdio

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    serve_stdio(settings)
    return 0


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    """The main job: build the index on first run, then serve."""
    from indexer.store import IndexError_, read_manifest

    try:
        read_manifest(settings.index_dir)
        print(f"dsqa: using the index at {settings.index_dir} (rebuild with `dsqa index`)")
    except IndexError_:
        docs_dir, ref = resolve_docs_dir(settings, None, try_fetch=True)
        if docs_dir is None:
            print(
                "dsqa: DeepSpeed's docs are missing, so this index holds only the installed package's API docs, "
                "the config catalogue and our notes.\n  To add the docs: `dsqa corpus fetch` (needs github.com), or "
                "DSQA_DOCS_DIR=/path/to/DeepSpeed, then `dsqa index`.",
                file=sys.stderr,
            )
        ns = argparse.Namespace(out=settings.index_dir, docs=docs_dir, quiet=False, json=False)
        cmd_index(ns, settings)
    if not getattr(args, "no_verify", False):
        settings = settings.model_copy(update={"verify_in_background": True})
    return cmd_serve(argparse.Namespace(index=None, host=args.host, port=args.port, workers=args.workers), settings)


def cmd_ask(args: argparse.Namespace, settings: Settings) -> int:
    from pydantic import ValidationError

    from app.ask import ask
    from app.engine import load_engine
    from app.errors import InvalidInput
    from app.schemas import AskRequest

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    try:
        request = AskRequest(question=args.question, k=args.k, topic=args.topic)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "question"
        raise InvalidInput(f"{first.get('msg', 'invalid value')}", field_name=field) from exc
    response = ask(load_engine(settings), request)
    if args.json:
        _print_json(response.model_dump())
        return 0
    print(response.answer, "\n")
    for n, p in enumerate(response.passages, 1):
        print(f"[{n}] {p.title} > {p.heading}\n    {p.url}")
    for s in response.snippets[:3]:
        print(f"\n--- snippet {s.id} ({s.kind}, {s.stamp}) from {s.source_url}\n{s.code}")
    return 0


def cmd_fetch(args: argparse.Namespace, settings: Settings) -> int:
    from indexer.fetch import fetch_docs

    ref = args.ref or settings.docs_ref or _default_ref()
    result = fetch_docs(
        settings.cache_dir, ref, args.url or settings.docs_url_template, sha256=args.sha256,
        timeout_s=settings.fetch_timeout_s, retries=settings.fetch_retries, force=args.force,
    )
    how = "reused cached" if result.from_cache else f"downloaded {result.bytes} bytes,"
    print(f"{how} docs for {result.ref} (sha256 {result.sha256[:12]}) -> {result.docs_dir}; now the default docs dir")
    return 0


def cmd_eval_retrieval(args: argparse.Namespace, settings: Settings) -> int:
    from eval.question_set import OUTSIDE_QUESTIONS
    from eval.retrieval_eval import format_table, run_retrieval_eval

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    extra = args.questions if args.questions is not None else (OUTSIDE_QUESTIONS if OUTSIDE_QUESTIONS.is_file() else None)
    results = run_retrieval_eval(settings, dev=args.dev, extra=extra, baseline=args.baseline)
    if args.json:
        _print_json(results)
    else:
        print(format_table(results))
    return 0


def cmd_eval_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from app.engine import load_engine
    from eval.doctor_eval import run_doctor_eval

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    index, retriever = load_engine(settings, strict=True).require()
    results = run_doctor_eval(index.path, retriever, settings.notes_dir)
    if args.json:
        _print_json(results)
    else:
        for how, report in results.items():
            for split in ("tune", "test"):
                r = report[split]
                print(f"{how:>17} {split:>4} logs {r['logs']:>3}  cause@1 {r['cause_at_1']:.3f}  source in 3 {r['source_in_3']:.3f} "
                      f"(of {r['raised']})  matched {r['matched']}  median {r['median_ms']} ms")
    return 0


def _training_retriever(args: argparse.Namespace, settings: Settings, learned_off: str) -> HybridRetriever:
    """The hybrid retriever of the index `--index` names, with the learned part being trained switched off."""
    from app.engine import load_engine
    from app.retriever import HybridRetriever

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    _, retriever = load_engine(settings.model_copy(update={learned_off: False})).require()
    assert isinstance(retriever, HybridRetriever)
    return retriever


def cmd_train_ranker(args: argparse.Namespace, settings: Settings) -> int:
    from app.engine import query_adapter_for, question_memory_for
    from app.ranking import RANKER_FILE
    from eval.question_set import load_split
    from eval.ranker_training import train_ranker

    retriever = _training_retriever(args, settings, "learned_ranking")
    adapter = query_adapter_for(retriever.embedder.name)  # the ranker reads the adapted cosines when one ships
    if adapter is not None:
        retriever = retriever.with_options(query_adapter=adapter)
    memory = question_memory_for(retriever.embedder.name, retriever.index)  # and the memory's `seen` scores
    if memory is not None:
        retriever = retriever.with_options(question_memory=memory)
    report = train_ranker(retriever, load_split("tune"), args.out or RANKER_FILE)
    _print_json(report)
    return 0


def cmd_train_adapter(args: argparse.Namespace, settings: Settings) -> int:
    from app.query_adapter import ADAPTER_FILE
    from eval.adapter_training import train_adapter
    from eval.question_set import load_split

    _print_json(train_adapter(_training_retriever(args, settings, "learned_ranking"), load_split("tune"), args.out or ADAPTER_FILE))
    return 0


def cmd_train_memory(args: argparse.Namespace, settings: Settings) -> int:
    from app.question_memory import MEMORY_FILE
    from eval.memory_training import train_memory
    from eval.question_set import load_split

    _print_json(train_memory(_training_retriever(args, settings, "learned_ranking"), load_split("tune"), args.out or MEMORY_FILE))
    return 0


def cmd_train_abstention(args: argparse.Namespace, settings: Settings) -> int:
    from app.coverage import ABSTENTION_FILE
    from eval.abstention_training import train_abstention
    from eval.answer_quality import load_unanswerable
    from eval.question_set import load_split, split_of

    retriever = _training_retriever(args, settings, "learned_abstention")
    unanswerable = [u for u in load_unanswerable() if split_of(u.id) == "tune"]
    _print_json(train_abstention(retriever, load_split("tune"), unanswerable, args.out or ABSTENTION_FILE))
    return 0


def cmd_train_answer(args: argparse.Namespace, settings: Settings) -> int:
    from app.answer import UNIT_MODEL_FILE
    from app.engine import load_engine
    from eval.answer_training import train_answer_units
    from eval.question_set import load_split

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    engine = load_engine(settings.model_copy(update={"learned_answer": False}))
    _print_json(train_answer_units(engine, load_split("tune"), args.out or UNIT_MODEL_FILE))
    return 0


def cmd_validate_config(args: argparse.Namespace, settings: Settings) -> int:
    from app.errors import InvalidInput
    from app.input_policy import parse_json
    from app.settings import input_limits
    from indexer.config_check import validate_config

    try:
        data = parse_json(Path(args.file).read_bytes(), input_limits(settings), field_name="file")
    except OSError as exc:
        print(f"dsqa: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    except InvalidInput as exc:
        print(f"dsqa: cannot read {args.file} as a config: {exc.message}", file=sys.stderr)
        return 2
    result = validate_config(data, world_size=args.world_size)
    if args.json:
        _print_json(result.to_json())
    else:
        print("valid" if result.valid else "invalid")
        for label, items in (("error", result.errors), ("warning", result.warnings)):
            for f in items:
                hint = f" ({f.suggestion})" if f.suggestion else ""
                print(f"{label}: {f.pointer or '/'}: {f.message}{hint}\n    see {f.doc_url}")
    return 0 if result.valid else 1


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from app.doctor import MAX_LOG_CHARS, diagnose_with
    from app.engine import load_engine

    raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()[-MAX_LOG_CHARS * 4:]
    log = raw.decode("utf-8", "replace")
    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    engine = load_engine(settings)  # not ready without an index: the installed deepspeed's catalogue alone
    result = diagnose_with(engine.index.path if engine.index is not None else None, engine.retriever, log, settings.notes_dir)
    if args.json:
        _print_json(result.to_json())
        return 0
    print(f"error: {result.error['type'] or '?'}: {result.error['message'][:300]}  (matched: {result.matched})")
    for n, cause in enumerate(result.causes, 1):
        print(f"\n{n}. {cause.title}\n   {cause.explanation}\n   fix: {cause.fix}" + (f"\n   source: {cause.source_url}" if cause.source_url else ""))
    return 0


def cmd_plan(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0 with a plan that fits, 1 when nothing fits (the reply still explains), 2 on bad input."""
    from pydantic import ValidationError

    from app.planner import PlanRequest, plan

    fields = {k: getattr(args, k) for k in PlanRequest.model_fields if getattr(args, k, None) is not None}
    if args.hf_config is not None:
        try:
            fields["hf_config"] = json.loads(args.hf_config.read_text(encoding="utf-8"))
        except (OSError, UnicodeError, ValueError) as exc:
            print(f"dsqa: hf_config: cannot read {args.hf_config} as JSON ({exc})", file=sys.stderr)
            return 2
        if not isinstance(fields["hf_config"], dict):
            print(f"dsqa: hf_config: {args.hf_config} is not a JSON object", file=sys.stderr)
            return 2
    try:
        request = PlanRequest(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "input"
        print(f"dsqa: {field}: {first.get('msg')}", file=sys.stderr)
        return 2
    result = plan(request)
    run = None
    if args.run and result.fits:
        from eval.plan_run import run_plan

        print("running the planned config on this machine at tiny scale (a few steps of a tiny model)...", file=sys.stderr)
        run = run_plan(result.config)
    if args.json:
        _print_json({**result.to_json(), **({"run": run} if run is not None else {})})
        return 0 if result.fits else 1
    c = result.choice
    print(f"{'plan' if result.fits else 'NOTHING FITS; nearest'}: ZeRO stage {c['stage']}, optimizer offload {c['offload_optimizer']}, "
          f"parameter offload {c['offload_param']}, {c['precision']}, {c['method']} fine-tuning")
    print(f"\n{'stage':>5} {'opt off':>8} {'param off':>9} {'GB/GPU':>8} {'CPU GB/node':>12}  fits")
    for cand in result.candidates:
        print(f"{cand.stage:>5} {cand.offload_optimizer:>8} {cand.offload_param:>9} {cand.per_gpu_gb:>8.1f} {cand.per_node_cpu_gb:>12.1f}  {'yes' if cand.fits else 'no: ' + cand.why_not}")
    print("\nwhy:")
    for r in result.reasons:
        print(f"- {r['text']}" + (f"\n    {r['url']}" if r["url"] else ""))
    print(f"\nvalidated for {request.gpus_per_node * request.nodes} GPUs: {'valid' if result.validated['valid'] else result.validated['errors']}")
    print(json.dumps(result.config, indent=2))
    if run is not None:
        adapted = "; ".join(run["adaptations"])
        print(f"\nrun here ({run['device']}): {run['status']}" + (f": {run['reason']}" if run["reason"] else "")
              + (f" (adapted: {adapted})" if adapted and adapted not in run["reason"] else ""))
    return 0 if result.fits else 1


def cmd_snippets_report(args: argparse.Namespace, settings: Settings) -> int:
    from collections import Counter

    from indexer.snippet_status import RUN_OUTCOMES, confusion
    from indexer.store import load_index

    index = load_index(args.index or settings.index_dir)
    snippets = list(index.snippets.values())
    failing = [s for s in snippets if s.status == "fails" and s.path.startswith(("docs/", "blogs/", "README"))]
    by_kind = dict(Counter(s.kind for s in snippets))
    by_status = dict(Counter(s.status for s in snippets))
    report: dict[str, Any] = {
        "total": len(snippets),
        "by_kind": by_kind,
        "by_status": by_status,
        "unclassified": sum(1 for s in snippets if not s.kind),
        "checked_with": index.manifest.get("deepspeed_version"),
        "stale_docs_snippets": [{"id": s.id, "kind": s.kind, "path": s.path, "source_url": s.source_url, "reason": s.reason} for s in failing],
        "runs": len(index.verification),
        # static verdict against the latest run of each snippet (the ledger of `dsqa verify`)
        "static_vs_run": confusion({s.id: s.status for s in snippets}, index.verification),
    }
    if args.json:
        _print_json(report)
        return 0
    print(f"{report['total']} snippets checked against deepspeed {report['checked_with']}")
    print("by kind:   " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    print("by status: " + ", ".join(f"{k} {v}" for k, v in sorted(by_status.items())))
    print(f"unclassified: {report['unclassified']}")
    if report["runs"]:
        print(f"\nstatic status vs run outcome ({report['runs']} runs in the ledger):")
        print(f"{'':14}" + "".join(f"{o:>26}" for o in RUN_OUTCOMES))
        for status, row in report["static_vs_run"].items():
            print(f"{status:14}" + "".join(f"{row[o]:>26}" for o in RUN_OUTCOMES))
    print("\ndocs snippets that fail against the installed deepspeed:")
    for s in failing:
        print(f"- [{s.kind}] {s.source_url}\n    {s.reason}")
    return 0


def cmd_skill_export(args: argparse.Namespace, settings: Settings) -> int:
    from app.skill_bundle import export_skill
    from indexer.store import load_index

    index = load_index(args.index or settings.index_dir)
    report = export_skill(args.dir, settings.notes_dir, index.snippets, index.verification)
    print(f"skill bundle -> {report.path}: {report.references} reference files, "
          f"{report.snippets_kept} verified snippets kept, {report.snippets_dropped} unverified left out")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsqa", description="Q&A over DeepSpeed's docs, API and config, with checked snippets.")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("index", help="build the index")
    s.add_argument("--docs", type=Path, help="DeepSpeed checkout or its docs/ folder")
    s.add_argument("--out", type=Path, help="index folder (default DSQA_INDEX_DIR or var/index)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_index)

    s = sub.add_parser("serve", help="serve the HTTP API")
    s.add_argument("--index", type=Path)
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--workers", type=int, help="worker processes, each with the index loaded (default 1; DSQA_WORKERS)")
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("mcp", help="serve the MCP tools over stdio (Claude Code, Cursor, VS Code)")
    s.add_argument("--index", type=Path)
    s.set_defaults(fn=cmd_mcp)

    s = sub.add_parser("up", help="build the index on first run, serve, and run the snippets in the background")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--no-verify", action="store_true", help="do not run the snippets in the background")
    s.add_argument("--workers", type=int, help="worker processes, each with the index loaded (default 1; DSQA_WORKERS)")
    s.set_defaults(fn=cmd_up)

    s = sub.add_parser("ask", help="ask one question")
    s.add_argument("question")
    s.add_argument("--k", type=int, default=5)
    s.add_argument("--topic")
    s.add_argument("--index", type=Path)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_ask)

    corpus = sub.add_parser("corpus", help="manage sources").add_subparsers(dest="corpus_command", required=True)
    s = corpus.add_parser("fetch", help="download DeepSpeed's docs for a ref")
    s.add_argument("--ref", help="git ref, default v<installed deepspeed>")
    s.add_argument("--sha256", help="expected sha256 of the tarball")
    s.add_argument("--url", help="URL template with {ref} (default: GitHub codeload)")
    s.add_argument("--force", action="store_true")
    s.set_defaults(fn=cmd_fetch)

    s = sub.add_parser("validate-config", help="check a DeepSpeed config against the installed deepspeed")
    s.add_argument("file", type=Path)
    s.add_argument("--world-size", type=int, default=1)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_validate_config)

    s = sub.add_parser("plan", help="plan a ds_config that fits a model on given hardware (memory from DeepSpeed's estimators)")
    s.add_argument("--params", type=float, help="parameter count, e.g. 7e9 (or --hf-config)")
    s.add_argument("--hf-config", type=Path, help="a Hugging Face model's config.json: sizes (and without --params, the count) from it")
    s.add_argument("--gpus-per-node", type=int, required=True)
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("--gpu-mem-gb", type=float, required=True)
    s.add_argument("--gpu-kind", default="", help="a100, h100, v100... (bf16 on Ampere and newer)")
    s.add_argument("--cpu-mem-gb", type=float)
    s.add_argument("--nvme", help="an NVMe path for ZeRO-Infinity offload")
    s.add_argument("--seq-len", type=int, default=2048)
    batch = s.add_mutually_exclusive_group()
    batch.add_argument("--micro-batch", type=int)
    batch.add_argument("--global-batch", type=int)
    s.add_argument("--hidden", type=int)
    s.add_argument("--layers", type=int)
    s.add_argument("--lora-share", type=float, help="LoRA: the trainable share of the parameters, e.g. 0.01 (default: full fine-tuning)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--run", action="store_true", help="also run the planned config here at tiny scale through the snippet runner")
    s.set_defaults(fn=cmd_plan)

    s = sub.add_parser("doctor", help="explain a DeepSpeed error from a pasted log or traceback")
    s.add_argument("file", help="a log file, or - for stdin")
    s.add_argument("--index", type=Path)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_doctor)

    snippets = sub.add_parser("snippets", help="snippet checks").add_subparsers(dest="snippets_command", required=True)
    s = snippets.add_parser("report", help="counts by kind and status, and stale docs snippets")
    s.add_argument("--index", type=Path)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_snippets_report)

    skill = sub.add_parser("skill", help="skill bundle for AI coding assistants").add_subparsers(dest="skill_command", required=True)
    s = skill.add_parser("export", help="write SKILL.md and reference files")
    s.add_argument("dir", type=Path)
    s.add_argument("--index", type=Path)
    s.set_defaults(fn=cmd_skill_export)

    ev = sub.add_parser("eval", help="evaluate").add_subparsers(dest="eval_command", required=True)
    s = ev.add_parser("retrieval", help="hit@k, MRR@10, nDCG@10 and mention share: our tune and test splits, the dev set")
    s.add_argument("--dev", type=Path, default=Path("../shared/eval/dev.jsonl"), help="the dev set (skipped when absent)")
    s.add_argument("--questions", type=Path, help="a further labelled question file, reported as its own set "
                   "(default: eval/heldout/outside.jsonl, the questions nothing was tuned or trained on)")
    s.add_argument("--index", type=Path)
    s.add_argument("--baseline", action="store_true", help="also score the peers: BM25 alone, dense alone, RRF")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_eval_retrieval)
    s = ev.add_parser("doctor", help="the error doctor on the real error logs (tests/data/error_logs.jsonl): cause right at 1 and "
                      "the raising line in the first 3, tune and test, as shipped (with retrieval) and without retrieval")
    s.add_argument("--index", type=Path)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_eval_doctor)
    s = ev.add_parser("train-adapter", help="fit the query adapter on the tune split (writes app/query_adapter.npz); then train-ranker")
    s.add_argument("--index", type=Path)
    s.add_argument("--out", type=Path, help="default: app/query_adapter.npz")
    s.set_defaults(fn=cmd_train_adapter)
    s = ev.add_parser("train-memory", help="remember the tune questions and their answering chunks (writes app/question_memory.npz); then train-ranker")
    s.add_argument("--index", type=Path)
    s.add_argument("--out", type=Path, help="default: app/question_memory.npz")
    s.set_defaults(fn=cmd_train_memory)
    s = ev.add_parser("train-ranker", help="fit the learned re-ranking on the tune split (writes app/ranker.json)")
    s.add_argument("--index", type=Path)
    s.add_argument("--out", type=Path, help="default: app/ranker.json")
    s.set_defaults(fn=cmd_train_ranker)
    s = ev.add_parser("train-abstention", help="fit the coverage decision on the tune split (writes app/abstention.json)")
    s.add_argument("--index", type=Path)
    s.add_argument("--out", type=Path, help="default: app/abstention.json")
    s.set_defaults(fn=cmd_train_abstention)
    s = ev.add_parser("train-answer", help="fit the choice of answer units on the tune split (writes app/answer_units.json)")
    s.add_argument("--index", type=Path)
    s.add_argument("--out", type=Path, help="default: app/answer_units.json")
    s.set_defaults(fn=cmd_train_answer)

    from eval.cli_runner import add_runner_commands  # run-snippet, verify, runner serve, eval answers

    add_runner_commands(sub, ev)
    from eval.cli_bench import add_bench_command

    add_bench_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # also for a library that sets its own logger to DEBUG (bm25s)
        handler.setLevel(level)
    try:
        settings = settings_from_env()
    except SettingsError as exc:
        print(f"dsqa: {exc}", file=sys.stderr)
        return 2
    try:
        return int(args.fn(args, settings) or 0)
    except DsqaError as exc:
        print(f"dsqa: {as_text(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidInput) else 1  # bad input exits like a usage error
    except (FileNotFoundError, ValueError) as exc:
        print(f"dsqa: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
