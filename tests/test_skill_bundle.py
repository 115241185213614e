"""The skill bundle: exports from our notes, deterministic, links resolve, only verified snippets."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from app.skill_bundle import export_skill
from corpus import NOTES_DIR
from indexer.build import chunk_all, gather_documents
from indexer.snippet_check import check_snippet


def _snippets() -> dict:
    docs, _, _ = gather_documents(None, NOTES_DIR, include_package=False)
    _, snippets = chunk_all(docs)
    return {s.id: check_snippet(s) for s in snippets}


def test_notes_are_complete() -> None:
    notes = sorted(NOTES_DIR.glob("*.md"))
    assert len(notes) >= 24
    for note in notes:
        meta = yaml.safe_load(note.read_text().split("---", 2)[1])
        assert {"title", "topics", "deepspeed", "requires", "sources"} <= set(meta), note.name
        assert set(meta["requires"]) <= {"cpu", "gpu", "nvme", "multi-gpu", "multi-node"}, note.name


def test_export_is_deterministic_and_links_resolve(tmp_path: Path) -> None:
    statuses = _snippets()
    a = export_skill(tmp_path / "a", NOTES_DIR, statuses)
    export_skill(tmp_path / "b", NOTES_DIR, statuses)
    files_a = sorted(p.relative_to(a.path) for p in a.path.rglob("*") if p.is_file())
    assert files_a == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    for rel in files_a:
        assert (a.path / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    skill = (a.path / "SKILL.md").read_text()
    front = yaml.safe_load(skill.split("---", 2)[1])
    assert front["name"] == "deepspeed-expert" and "Use when" in front["description"]
    links = re.findall(r"\]\(([^)]+)\)", skill)
    assert len(links) >= 10 and all((a.path / link).is_file() for link in links)
    assert a.snippets_kept > 0
    kept_codes = [code for f in (a.path / "references").glob("*.md") for code in re.findall(r"```\w*\n(.*?)\n```", f.read_text(), re.S)]
    verified = {s.code for s in statuses.values() if s.status == "checked"}
    assert kept_codes and all(code in verified for code in kept_codes)


def test_every_notes_config_and_python_snippet_passes_static_checks() -> None:
    statuses = _snippets()
    checked = [s for s in statuses.values() if s.kind in {"ds_config", "python", "launcher", "hostfile"}]
    assert len(checked) >= 30
    bad = [(s.path, s.kind, s.status, s.reason) for s in checked if s.status not in {"checked", "not_checked"}]
    assert bad == []


def test_a_failed_run_keeps_a_snippet_out(tmp_path: Path) -> None:
    statuses = _snippets()
    kept = export_skill(tmp_path / "a", NOTES_DIR, statuses).snippets_kept
    ok = [s for s in statuses.values() if s.status == "checked" and s.kind in {"python", "ds_config"}]
    runs = {ok[0].id: {"id": ok[0].id, "status": "failed", "blame": "snippet"}}
    report = export_skill(tmp_path / "b", NOTES_DIR, statuses, runs)
    assert report.snippets_kept == kept - 1
    assert ok[0].code not in "".join(f.read_text() for f in (tmp_path / "b" / "references").glob("*.md"))
