"""Read DeepSpeed's docs from a directory: Jekyll Markdown, reST code-docs, blog READMEs.

Each document knows its repository path and its public URL (site permalinks from
docs/_config.yml and front matter; code-docs on Read the Docs; blogs on GitHub).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from indexer.documents import Document
from indexer.markdown import parse_markdown, split_front_matter
from indexer.rst import parse_rst

log = logging.getLogger(__name__)

SITE = "https://www.deepspeed.ai"
RTD = "https://deepspeed.readthedocs.io/en/latest"
GITHUB = "https://github.com/deepspeedai/DeepSpeed/blob/master"
_POST_NAME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})-(.+)\.md$")
# pages that only list other pages: nothing to answer from
_SKIP = {"docs/_pages/posts-landing.md", "docs/_pages/posts_list_landing.md", "docs/_pages/tutorials-landing.md"}


def find_docs_root(path: Path) -> Path:
    """Accept the repository root or its docs/ folder; return the folder that holds docs/."""
    path = path.expanduser().resolve()
    if (path / "docs").is_dir():
        return path
    if path.name == "docs" and path.is_dir():
        return path.parent
    raise FileNotFoundError(f"no DeepSpeed docs under {path}: expected a folder with docs/_tutorials or docs/_pages")


def load_site_config(root: Path) -> dict[str, Any]:
    cfg = root / "docs" / "_config.yml"
    if not cfg.is_file():
        return {}
    try:
        data = yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def page_url(rel: str, meta: dict[str, Any], site: dict[str, Any]) -> str:
    """The public URL of a docs file (without anchor)."""
    base = str(site.get("url") or SITE).rstrip("/")
    permalink = meta.get("permalink")
    if isinstance(permalink, str) and permalink.startswith("/"):
        return base + permalink
    parts = rel.split("/")
    name = parts[-1].rsplit(".", 1)[0]
    if rel == "docs/index.md":
        return base + "/"
    if len(parts) >= 2 and parts[0] == "docs" and parts[1].startswith("_"):
        collection = parts[1][1:]
        if collection == "pages":
            return f"{base}/docs/{name}/"
        if collection == "posts":
            m = _POST_NAME.match(parts[-1])
            if m:
                return f"{base}/{m.group(1)}/{m.group(2)}/{m.group(3)}/{m.group(4)}.html"
        collections = site.get("collections") or {}
        pattern = (collections.get(collection) or {}).get("permalink", "/:collection/:path/")
        path = "/".join(parts[2:]).rsplit(".", 1)[0]
        return base + pattern.replace(":collection", collection).replace(":path", path).replace(":name", name)
    if rel.startswith("docs/code-docs/source/"):
        return f"{RTD}/{rel.removeprefix('docs/code-docs/source/').rsplit('.', 1)[0]}.html"
    return f"{GITHUB}/{rel}"


def _topic_of(rel: str, meta: dict[str, Any]) -> str:
    tags = meta.get("tags")
    if isinstance(tags, str):
        return tags.split()[0]
    if isinstance(tags, list) and tags:
        return str(tags[0])
    return ""


def iter_doc_files(root: Path) -> Iterator[Path]:
    docs = root / "docs"
    patterns = ["_tutorials/**/*.md", "_pages/*.md", "_posts/*.md", "*.md", "code-docs/source/**/*.rst"]
    seen: set[Path] = set()
    for pattern in patterns:
        for p in sorted(docs.glob(pattern)):
            if p not in seen and p.is_file():
                seen.add(p)
                yield p
    for p in sorted((root / "blogs").glob("**/README.md")) if (root / "blogs").is_dir() else []:
        yield p
    if (root / "README.md").is_file():
        yield root / "README.md"


def read_doc(path: Path, root: Path, site: dict[str, Any]) -> Document | None:
    rel = path.relative_to(root).as_posix()
    if rel in _SKIP:
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".rst":
        title, sections = parse_rst(text, title_fallback=path.stem)
        meta: dict[str, Any] = {}
    else:
        meta, body = split_front_matter(text)
        title = str(meta.get("title") or _first_heading(body) or path.parent.name or path.stem)
        sections = parse_markdown(body, title=title)
    if not sections:
        return None
    meta = {**meta, "topic": _topic_of(rel, meta)}
    return Document(path=rel, title=title, url=page_url(rel, meta, site), source="docs", sections=sections, meta=meta)


def _first_heading(body: str) -> str:
    m = re.search(r"^#{1,2}\s+(.+)$", body, re.M)
    return re.sub(r"[*_`]", "", m.group(1)).strip() if m else ""


def read_docs_dir(path: Path) -> list[Document]:
    root = find_docs_root(path)
    site = load_site_config(root)
    docs: list[Document] = []
    for file in iter_doc_files(root):
        try:
            doc = read_doc(file, root, site)
        except (OSError, UnicodeError, ValueError) as exc:  # one bad file must not stop the build
            log.warning("skipping %s: %s", file, exc)
            continue
        if doc is not None:
            docs.append(doc)
    return docs


def note_url(file: Path) -> str:
    """Where a note of ours is cited: `dsqa://notes/<its file name without .md>`."""
    return f"dsqa://notes/{file.stem}"


def read_notes_dir(path: Path) -> list[Document]:
    """Our own notes: Markdown with front matter (title, topics, requires, sources)."""
    docs: list[Document] = []
    if not path.is_dir():
        return docs
    for file in sorted(path.glob("*.md")):
        meta, body = split_front_matter(file.read_text(encoding="utf-8"))
        title = str(meta.get("title") or _first_heading(body) or file.stem)
        sections = parse_markdown(body, title=title)
        if not sections:
            continue
        topics = meta.get("topics") or []
        meta["topic"] = str(topics[0]) if isinstance(topics, list) and topics else ""
        rel = f"corpus/notes/{file.name}"
        docs.append(Document(path=rel, title=title, url=note_url(file), source="notes", sections=sections, meta=meta))
    return docs
