"""Markdown (Jekyll flavour) to sections: front matter, headings, prose and whole code blocks.

Pure functions: text in, dataclasses out. markdown-it-py finds the block structure; the prose of
each top-level block is taken from its source lines and cleaned of HTML, Liquid and kramdown
noise so that a passage reads as text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml
from markdown_it import MarkdownIt

from indexer.documents import Block, Section

_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.S)
_LIQUID = re.compile(r"{%.*?%}|{{.*?}}", re.S)
_KRAMDOWN_IAL = re.compile(r"{:[^}\n]*}")
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_HTML_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_SUPERSCRIPT = re.compile(r"<sup>(.*?)</sup>", re.S)  # 2<sup>x</sup>: 2^x, not 2x (tags inside it too)
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_REF_LINK = re.compile(r"\[([^\]]+)\]\[[^\]]*\]")
_FOOTNOTE = re.compile(r"^[ \t]*\[\^[^\]\s]+\]:[ \t]*|[ \t]?\[\^[^\]\s]+\]", re.M)  # "[^name]: text" keeps its text; "word[^name]" its word
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_MULTISPACE = re.compile(r"[ \t]{2,}")
_ESCAPE = re.compile(r"\\([_*\[\]()#`{}|<>~])")


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """Return (front matter, body). Malformed YAML is treated as no front matter."""
    m = _FRONT_MATTER.match(text)
    if not m:
        return {}, text
    try:
        meta = yaml.safe_load(m.group(1)) or {}
    except yaml.YAMLError:
        meta = {}
    return (meta if isinstance(meta, dict) else {}), text[m.end():]


def slugify_kramdown(heading: str) -> str:
    """The anchor kramdown and GitHub give a heading: lowercase, punctuation dropped, spaces to -."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def clean_inline(text: str) -> str:
    """Remove markup noise from prose while keeping its words and identifiers."""
    text = _HTML_COMMENT.sub("", text)
    text = _LIQUID.sub("", text)
    text = _KRAMDOWN_IAL.sub("", text)
    text = _IMAGE.sub("", text)
    text = _FOOTNOTE.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _REF_LINK.sub(r"\1", text)
    text = _SUPERSCRIPT.sub(lambda m: "^" + _HTML_TAG.sub("", m.group(1)), text)
    text = _HTML_TAG.sub("", text)
    text = text.replace("&nbsp;", " ").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    text = text.replace("**", "")
    return _ESCAPE.sub(r"\1", text)


def clean_prose(text: str) -> str:
    """Clean a multi-line block: tables become 'cell; cell' lines, empty lines collapse."""
    out: list[str] = []
    for raw in clean_inline(text).splitlines():
        line = raw.rstrip()
        if _TABLE_RULE.match(line):
            continue
        if line.lstrip().startswith("|") and line.count("|") >= 2:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            line = "; ".join(c for c in cells if c)
        line = _MULTISPACE.sub(" ", line)
        if line.strip():
            out.append(line)
    return "\n".join(out).strip()


def parse_info_string(info: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """```python requires=gpu title=x``` -> ("python", (("requires", "gpu"), ("title", "x")))."""
    words = info.strip().strip("{}").split()
    if not words:
        return "", ()
    lang = words[0].lstrip(".").lower()
    attrs = tuple((k, v) for k, _, v in (w.partition("=") for w in words[1:]) if v)
    return lang, attrs


def parse_markdown(
    text: str,
    title: str,
    anchor_for: Callable[[str], str] = slugify_kramdown,
) -> list[Section]:
    """Split a Markdown body into sections by heading, each with prose and code blocks in order."""
    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse(text)
    lines = text.splitlines()
    sections: list[Section] = [Section(heading="", trail=(title,), anchor="")]
    stack: list[tuple[int, str]] = []  # (level, heading) of open headings
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.level != 0 or tok.nesting == -1:
            i += 1
            continue
        if tok.type == "heading_open":
            level = int(tok.tag[1:])
            heading = clean_inline(tokens[i + 1].content).strip().strip("`")
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, heading))
            trail = (title, *[h for _, h in stack if h and h != title])
            sections.append(Section(heading=heading, trail=trail, anchor=anchor_for(heading)))
            i += 3
            continue
        if tok.type == "fence":
            lang, attrs = parse_info_string(tok.info)
            code = tok.content.rstrip("\n")
            if code.strip():
                sections[-1].blocks.append(Block(kind="code", text=code, language=lang, attrs=attrs))
            i += 1
            continue
        if tok.type == "code_block":  # indented code
            code = tok.content.rstrip("\n")
            if code.strip():
                sections[-1].blocks.append(Block(kind="code", text=code, language=""))
            i += 1
            continue
        if tok.map is None:
            i += 1
            continue
        start, end = tok.map
        # Nested fences (inside list items) become their own code blocks after the prose.
        close = _find_close(tokens, i)
        nested = [t for t in tokens[i + 1 : close] if t.type == "fence" and t.content.strip()]
        src_lines = lines[start:end]
        if nested:
            src_lines = _drop_fenced_lines(src_lines)
        prose = clean_prose("\n".join(src_lines))
        if prose:
            sections[-1].blocks.append(Block(kind="text", text=prose))
        for t in nested:
            lang, attrs = parse_info_string(t.info)
            sections[-1].blocks.append(
                Block(kind="code", text=t.content.rstrip("\n"), language=lang, attrs=attrs)
            )
        i = close + 1
    return [s for s in sections if s.blocks]


def _find_close(tokens: list[Any], i: int) -> int:
    """Index of the token that closes the block opened at i (i itself for a self-closing one)."""
    if tokens[i].nesting != 1:
        return i
    depth = 0
    for j in range(i, len(tokens)):
        depth += tokens[j].nesting
        if depth == 0:
            return j
    return len(tokens) - 1


def _drop_fenced_lines(lines: list[str]) -> list[str]:
    out: list[str] = []
    fence: str | None = None
    for line in lines:
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        out.append(line)
    return out
