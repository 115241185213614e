"""`dsqa eval retrieval|doctor|train-*` (registered by app/cli.py): the quality reports on our question
sets and error logs, and the training of each learned part on the `tune` split only."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli_tools import print_json
from app.settings import Settings

if TYPE_CHECKING:
    from app.retriever import HybridRetriever


def cmd_eval_retrieval(args: argparse.Namespace, settings: Settings) -> int:
    from eval.question_set import OUTSIDE_B_QUESTIONS, OUTSIDE_QUESTIONS
    from eval.retrieval_eval import format_table, run_retrieval_eval

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    extra = args.questions or [p for p in (OUTSIDE_QUESTIONS, OUTSIDE_B_QUESTIONS) if p.is_file()]
    results = run_retrieval_eval(settings, dev=args.dev, extra=extra, baseline=args.baseline)
    if args.json:
        print_json(results)
    else:
        print(format_table(results))
    return 0


def cmd_eval_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from app.engine import load_engine
    from eval.doctor_eval import SPLITS, run_doctor_eval

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    index, retriever = load_engine(settings, strict=True).require()
    if args.known_ablation:
        from eval.doctor_eval import run_known_ablation

        ablation = run_known_ablation(index.path, retriever, settings.notes_dir)
        if args.json:
            print_json(ablation)
        else:
            print(f"tune and tune-only logs {ablation['logs']}, first cause a known one found by its text {ablation['known_first']}: "
                  f"right with that cause in other words {ablation['new_wording']} ({ablation['new_wording_share']:.3f}), "
                  f"with the cause unknown {ablation['unknown']} ({ablation['unknown_share']:.3f})")
        return 0
    results = run_doctor_eval(index.path, retriever, settings.notes_dir)
    if args.json:
        print_json(results)
    else:
        for how, report in results.items():
            for split in SPLITS:
                r = report[split]
                if not r["logs"]:
                    continue
                print(f"{how:>17} {split:>9} logs {r['logs']:>3}  cause@1 {r['cause_at_1']:.3f}  source in 3 {r['source_in_3']:.3f} "
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
    print_json(report)
    return 0


def cmd_train_adapter(args: argparse.Namespace, settings: Settings) -> int:
    from app.query_adapter import ADAPTER_FILE
    from eval.adapter_training import train_adapter
    from eval.question_set import load_split

    print_json(train_adapter(_training_retriever(args, settings, "learned_ranking"), load_split("tune"), args.out or ADAPTER_FILE))
    return 0


def cmd_train_memory(args: argparse.Namespace, settings: Settings) -> int:
    from app.question_memory import MEMORY_FILE
    from eval.memory_training import train_memory
    from eval.question_set import load_split

    print_json(train_memory(_training_retriever(args, settings, "learned_ranking"), load_split("tune"), args.out or MEMORY_FILE))
    return 0


def cmd_train_abstention(args: argparse.Namespace, settings: Settings) -> int:
    from app.coverage import ABSTENTION_FILE
    from eval.abstention_training import train_on_tune

    print_json(train_on_tune(_training_retriever(args, settings, "learned_abstention"), args.out or ABSTENTION_FILE))
    return 0


def cmd_train_answer(args: argparse.Namespace, settings: Settings) -> int:
    from app.answer import UNIT_MODEL_FILE
    from app.engine import load_engine
    from eval.answer_training import train_answer_units
    from eval.question_set import load_split

    if args.index:
        settings = settings.model_copy(update={"index_dir": args.index})
    engine = load_engine(settings.model_copy(update={"learned_answer": False}))
    print_json(train_answer_units(engine, load_split("tune"), args.out or UNIT_MODEL_FILE))
    return 0


def add_eval_commands(ev: Any) -> None:
    """Register the commands on `dsqa eval`'s sub-parsers."""
    s = ev.add_parser("retrieval", help="hit@k, MRR@10, nDCG@10 and mention share: our tune and test splits, the dev set")
    s.add_argument("--dev", type=Path, default=Path("../shared/eval/dev.jsonl"), help="the dev set (skipped when absent)")
    s.add_argument("--questions", type=Path, action="append", help="a further labelled question file, reported as its own set; "
                   "repeatable (default: eval/heldout/outside.jsonl and outside_b.jsonl, the questions nothing was tuned or trained on)")
    s.add_argument("--index", type=Path)
    s.add_argument("--baseline", action="store_true", help="also score the peers: BM25 alone, dense alone, RRF")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_eval_retrieval)
    s = ev.add_parser("doctor", help="the error doctor on the real error logs (tests/data/error_logs.jsonl, and the tune-only ones): cause right at 1 and "
                      "the raising line in the first 3, tune and test, as shipped (with retrieval) and without retrieval")
    s.add_argument("--index", type=Path)
    s.add_argument("--json", action="store_true")
    s.add_argument("--known-ablation", action="store_true",
                   help="instead: on the tuning logs whose first cause is a known one found by its text, the cause right with that "
                        "cause's texts taken away, and with the cause taken away (about two minutes)")
    s.set_defaults(fn=cmd_eval_doctor)
    trainers = (
        ("train-adapter", "fit the query adapter on the tune split (writes {out}); then train-ranker", "app/query_adapter.npz", cmd_train_adapter),
        ("train-memory", "remember the tune questions and their answering chunks (writes {out}); then train-ranker",
         "app/question_memory.npz", cmd_train_memory),
        ("train-ranker", "fit the learned re-ranking on the tune split (writes {out})", "app/ranker.json", cmd_train_ranker),
        ("train-abstention", "fit the coverage decision on the tune split (writes {out})", "app/abstention.json", cmd_train_abstention),
        ("train-answer", "fit the choice of answer units on the tune split (writes {out})", "app/answer_units.json", cmd_train_answer),
    )
    for name, what, default, fn in trainers:
        s = ev.add_parser(name, help=what.format(out=default))
        s.add_argument("--index", type=Path)
        s.add_argument("--out", type=Path, help=f"default: {default}")
        s.set_defaults(fn=fn)
