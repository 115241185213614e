"""The `dsqa` tool commands (registered by app/cli.py): `validate-config`, `plan`, `doctor`,
`snippets report` and `skill export`, each thin over its core module."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.settings import Settings


def print_json(data: Any) -> None:
    """The one way every `dsqa` command prints `--json` output."""
    print(json.dumps(data, indent=2, ensure_ascii=False))


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
        print_json(result.to_json())
    else:
        print("valid" if result.valid else "invalid")
        for label, items in (("error", result.errors), ("warning", result.warnings)):
            for f in items:
                hint = f" ({f.suggestion})" if f.suggestion else ""
                print(f"{label}: {f.pointer or '/'}: {f.message}{hint}\n    see {f.doc_url}")
    return 0 if result.valid else 1


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from app.doctor import diagnose_with
    from app.engine import load_engine
    from app.error_log import MAX_LOG_CHARS

    raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()[-MAX_LOG_CHARS * 4:]
    log = raw.decode("utf-8", "replace")
    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    engine = load_engine(settings)  # not ready without an index: the installed deepspeed's catalogue alone
    result = diagnose_with(engine.index.path if engine.index is not None else None, engine.retriever, log, settings.notes_dir)
    if args.json:
        print_json(result.to_json())
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
        print_json({**result.to_json(), **({"run": run} if run is not None else {})})
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
        print_json(report)
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


def add_tool_commands(sub: Any) -> None:
    """Register the commands on the `dsqa` sub-parsers."""
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
