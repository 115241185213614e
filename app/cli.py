"""The `dsqa` command: thin sub-commands over the indexer, the `ask` core and the evaluators."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported anywhere
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from app.cli_tools import print_json  # noqa: E402
from app.errors import DsqaError, InvalidInput, as_text  # noqa: E402
from app.settings import Settings, SettingsError, settings_from_env  # noqa: E402

log = logging.getLogger("dsqa")


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
        print_json(report.to_json())
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
        print_json(response.model_dump())
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

    from app.cli_tools import (
        add_tool_commands,  # validate-config, plan, doctor, snippets report, skill export
    )

    add_tool_commands(sub)

    ev = sub.add_parser("eval", help="evaluate").add_subparsers(dest="eval_command", required=True)
    from eval.cli_eval import add_eval_commands  # retrieval, doctor, train-*

    add_eval_commands(ev)
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
