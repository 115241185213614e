"""reStructuredText to sections: headings by underline, code-block directives and literal blocks.

A small line-based reader, enough for DeepSpeed's Sphinx sources: it keeps code whole, turns
admonitions into prose, and names autodoc directives so the symbol stays searchable.
"""

from __future__ import annotations

import re

from indexer.documents import Block, Section

_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+:._])\1{2,}\s*$")
_DIRECTIVE = re.compile(r"^\.\.\s+([\w:-]+)::\s*(.*)$")
_ROLE = re.compile(r":[\w:]+:`~?([^`<]+?)(?:\s*<[^>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_+")
_REF = re.compile(r"`([^`]+)`_+")
_LITERAL = re.compile(r"``([^`]+)``")
_CODE_DIRECTIVES = {"code-block", "code", "sourcecode"}
_AUTODOC = re.compile(r"^auto(function|class|method|module|pydantic_model|data|attribute)$")


def slugify_sphinx(heading: str) -> str:
    """The id Sphinx gives a section: lowercase words joined by '-'."""
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def clean_rst_inline(text: str) -> str:
    text = _ROLE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _REF.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = text.replace("**", "")
    return text


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _take_indented(lines: list[str], i: int, base: int) -> tuple[list[str], int]:
    """Lines from i that are blank or indented deeper than base; returns them dedented."""
    body: list[str] = []
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
        body.append(lines[i])
        i += 1
    while body and not body[-1].strip():
        body.pop()
    while body and not body[0].strip():
        body.pop(0)
    depth = min((_indent(b) for b in body if b.strip()), default=0)
    return [b[depth:] for b in body], i


def _is_heading(lines: list[str], i: int) -> bool:
    if i + 1 >= len(lines):
        return False
    text, under = lines[i].rstrip(), lines[i + 1].rstrip()
    return bool(text.strip()) and not text.startswith(" ") and bool(_UNDERLINE.match(under)) and len(under) >= len(text.strip()) - 1


def parse_rst(text: str, title_fallback: str) -> tuple[str, list[Section]]:
    """Return (document title, sections)."""
    lines = text.splitlines()
    styles: list[str] = []  # underline characters in order of first use = heading levels
    stack: list[tuple[int, str]] = []
    title = ""
    sections: list[Section] = [Section(heading="", trail=(title_fallback,), anchor="")]
    para: list[str] = []

    def flush() -> None:
        if para:
            prose = clean_rst_inline("\n".join(p.rstrip() for p in para)).strip()
            if prose:
                sections[-1].blocks.append(Block(kind="text", text=prose))
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        # overline + title + underline
        if _UNDERLINE.match(line.rstrip()) and i + 2 < len(lines) and _UNDERLINE.match(lines[i + 2].rstrip()) and lines[i + 1].strip():
            flush()
            heading = clean_rst_inline(lines[i + 1].strip())
            _open_heading(heading, "o" + line.strip()[0], styles, stack, sections, title)
            if not title:
                title = heading
                sections[-1].trail = (title,)
            i += 3
            continue
        if _is_heading(lines, i):
            flush()
            heading = clean_rst_inline(line.strip())
            _open_heading(heading, lines[i + 1].strip()[0], styles, stack, sections, title)
            if not title:
                title = heading
                sections[-1].trail = (title,)
            i += 2
            continue
        m = _DIRECTIVE.match(line.strip()) if _indent(line) == 0 or not para else None
        if m:
            flush()
            name, arg = m.group(1), m.group(2).strip()
            base = _indent(line)
            j = i + 1
            # directive options
            while j < len(lines) and lines[j].strip().startswith(":") and _indent(lines[j]) > base:
                j += 1
            body, j = _take_indented(lines, j, base)
            if name in _CODE_DIRECTIVES:
                code = "\n".join(body)
                if code.strip():
                    sections[-1].blocks.append(Block(kind="code", text=code, language=arg.lower()))
            elif _AUTODOC.match(name):
                sections[-1].blocks.append(Block(kind="text", text=f"API reference: {arg}"))
            elif name in {"note", "warning", "tip", "important", "attention", "caution", "seealso"}:
                prose = clean_rst_inline(" ".join([arg, *body]).strip())
                if prose:
                    sections[-1].blocks.append(Block(kind="text", text=f"{name.capitalize()}: {prose}"))
            i = j
            continue
        if line.strip().startswith(".. "):  # comments, targets
            flush()
            _, i = _take_indented(lines, i + 1, _indent(line))
            continue
        if not line.strip():
            flush()
            i += 1
            continue
        para.append(line)
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            # literal block follows
            stripped = line.rstrip()
            para[-1] = stripped[:-3] if stripped.endswith(" ::") else stripped[:-1]
            flush()
            j = i + 1
            body, j = _take_indented(lines, j, _indent(line))
            if body:
                sections[-1].blocks.append(Block(kind="code", text="\n".join(body), language=""))
            i = j
            continue
        i += 1
    flush()
    return title or title_fallback, [s for s in sections if s.blocks]


def _open_heading(
    heading: str,
    style: str,
    styles: list[str],
    stack: list[tuple[int, str]],
    sections: list[Section],
    title: str,
) -> int:
    if style not in styles:
        styles.append(style)
    level = styles.index(style)
    while stack and stack[-1][0] >= level:
        stack.pop()
    stack.append((level, heading))
    top = title or heading
    trail = (top, *[h for _, h in stack if h != top])
    sections.append(Section(heading=heading, trail=trail, anchor=slugify_sphinx(heading)))
    return level
