"""`dsqa skill export DIR`: a skill bundle for AI coding assistants, from our notes and the catalogue.

SKILL.md (front matter `name`, `description`) routes to one reference file per topic; only
snippets whose verification passed are included, each stamped with the deepspeed version.
The export is deterministic: same notes, index and package give byte-identical files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.config_catalogue import ConfigKey, build_catalogue, deepspeed_version
from indexer.docs_source import read_notes_dir
from indexer.documents import Document, Snippet, content_hash
from indexer.package_source import describe_key
from indexer.snippet_status import CHECKED, LABELS, RAN, Verdict, verdict

NAME = "deepspeed-expert"
DESCRIPTION = (
    "Use when writing, reviewing or debugging DeepSpeed training code or ds_config JSON: choosing a "
    "ZeRO stage, CPU/NVMe offload, fp16/bf16 loss scaling, pipeline and 3D parallelism, checkpoints, "
    "the deepspeed launcher and hostfiles, HF Trainer integration, memory estimates and common errors. "
    "Facts and config keys are checked against deepspeed {version}."
)


@dataclass(frozen=True)
class ExportReport:
    path: Path
    references: int
    snippets_kept: int
    snippets_dropped: int


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "general"


def _verdict(code: str, statuses: dict[str, Snippet], runs: dict[str, dict[str, Any]]) -> Verdict | None:
    """The snippet's status in the one vocabulary when it ran or checked clean, else None (dropped)."""
    sid = content_hash(code, length=12)
    snippet = statuses.get(sid)
    if snippet is None:
        return None
    shown = verdict(snippet.status, snippet.reason, snippet.checked_with, runs.get(sid))
    return shown if shown.status in (RAN, CHECKED) else None


def _render_note(doc: Document, statuses: dict[str, Snippet], runs: dict[str, dict[str, Any]], version: str) -> tuple[str, int, int]:
    kept = dropped = 0
    lines = [f"## {doc.title}", ""]
    for section in doc.sections:
        if section.heading and section.heading != doc.title:
            lines += [f"### {section.heading}", ""]
        for block in section.blocks:
            if block.kind == "text":
                lines += [block.text, ""]
            elif (shown := _verdict(block.text, statuses, runs)) is not None:
                kept += 1
                lines += [f"```{block.language}", block.text, "```", f"<sub>{LABELS[shown.status]}: {shown.words}</sub>", ""]
            else:
                dropped += 1
    sources = doc.meta.get("sources") or []
    if sources:
        lines += ["Sources: " + ", ".join(f"<{s}>" for s in sources), ""]
    return "\n".join(lines), kept, dropped


def _render_config(section: str, keys: list[ConfigKey]) -> str:
    lines = [f"## `{section}`", ""]
    for key in keys:
        lines.append("- " + describe_key(key, {}).replace("\n", " "))
    return "\n".join(lines) + "\n"


def export_skill(out: Path, notes_dir: Path, snippets: dict[str, Snippet], runs: dict[str, dict[str, Any]] | None = None) -> ExportReport:
    """Write the bundle into a temp dir beside `out` and rename it into place."""
    version = deepspeed_version()
    by_topic: dict[str, list[Document]] = defaultdict(list)
    for doc in sorted(read_notes_dir(notes_dir), key=lambda d: d.path):
        topics = doc.meta.get("topics") or ["general"]
        by_topic[_slug(str(topics[0]))].append(doc)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    kept = dropped = 0
    try:
        refs = tmp / "references"
        refs.mkdir()
        index_lines: list[str] = []
        for topic in sorted(by_topic):
            parts = [f"# DeepSpeed: {topic}", ""]
            for doc in by_topic[topic]:
                text, k, d = _render_note(doc, snippets, runs or {}, version)
                parts.append(text)
                kept += k
                dropped += d
            (refs / f"{topic}.md").write_text("\n".join(parts).rstrip() + "\n", encoding="utf-8")
            titles = "; ".join(d.title for d in by_topic[topic])
            index_lines.append(f"- [{topic}](references/{topic}.md): {titles}")
        catalogue: dict[str, list[ConfigKey]] = defaultdict(list)
        for key in build_catalogue():
            if not key.removed:
                catalogue[key.section].append(key)
        config_parts = [f"# DeepSpeed config keys (deepspeed {version})", "", "Every key the installed deepspeed reads, with type and default.", ""]
        config_parts += [_render_config(s, catalogue[s]) for s in sorted(catalogue)]
        (refs / "config-keys.md").write_text("\n".join(config_parts), encoding="utf-8")
        removed = [k for k in build_catalogue() if k.removed]
        removed_lines = [f"- `{k.path}`: {k.removed}" for k in removed]
        (refs / "removed-features.md").write_text(
            f"# Removed in deepspeed {version}\n\nDeepSpeed rejects these config blocks; older docs and answers still show them.\n\n"
            + "\n".join(removed_lines) + "\n",
            encoding="utf-8",
        )
        skill = [
            "---",
            f"name: {NAME}",
            f"description: {json.dumps(DESCRIPTION.format(version=version))}",  # quoted: it holds ': '
            "---",
            "",
            "# DeepSpeed expert",
            "",
            f"Practical guidance for DeepSpeed {version}. Read the reference for the topic at hand before writing",
            "code or a ds_config; every snippet there ran or was checked statically against that version (each says which).",
            "",
            "## How to use",
            "",
            "1. Find the topic below and open its reference file.",
            "2. For any config key, look it up in [config-keys](references/config-keys.md) (type, default, meaning);",
            "   never invent keys: DeepSpeed ignores unknown top-level keys silently.",
            "3. Check [removed-features](references/removed-features.md) before suggesting an older feature.",
            "4. Keep `train_batch_size = micro batch x gradient_accumulation_steps x world size`.",
            "",
            "## Topics",
            "",
            *index_lines,
            "- [config-keys](references/config-keys.md): every config key with type and default",
            "- [removed-features](references/removed-features.md): blocks this version rejects",
            "",
        ]
        (tmp / "SKILL.md").write_text("\n".join(skill), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportReport(out, len(by_topic) + 2, kept, dropped)
