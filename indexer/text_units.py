"""Whole text units of a passage, the pieces an answer may quote.

A unit is a sentence of a paragraph (hard-wrapped lines joined first), a list item, or a table row
that keeps its key and default ("`wandb.group`: Name for the WandB group. (default `None`)").
Code, signatures, captions, API stub lines and sentences that point at something not quoted ("the
example below shows:") are never units. Pure functions over the passage text as indexed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from indexer.documents import Chunk
from indexer.known_causes import opens_a_cause, reader_line

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
# a line that introduces code with a colon, then a fence of one short line: the command is what the line says to
# run ("... use the following environment variable: `DS_SKIP_CUDA_CHECK=1`"), quoted with it as one unit
SHORT_CODE_CHARS = 100
_SHORT_FENCE_AFTER_COLON = re.compile(r"(?m)^(?P<line>[^\n]*\S:)[ \t]*\n(?:[ \t]*\n)*[ \t]*```[\w+-]*[ \t]*\n"
                                      rf"[ \t]*(?P<code>[^\n`]{{1,{SHORT_CODE_CHARS}}}?)[ \t]*\n[ \t]*```")
# "#." and reST prose "# Note ..." number items too, and a docstring's "*``name``: ..." without its space
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)]|#\.|#(?=\s+[A-Z]))\s+|^\s*\*(?=``?\w)")
# a config catalogue line as `indexer/package_source.describe_key` writes it
CATALOGUE_ENTRY = re.compile(r"^`(?P<key>[\w.]+)` \(type (?P<type>[^;]+); default (?P<default>.*?)\)\.\s*(?P<rest>.*)$")
# `key: [type]` (also *key*, and `section:key` for a nested one)
_KEY_LINE = re.compile(r"^[`*]?(?P<key>[a-z_][\w.]*(?::[a-z_][\w.]*)*)[`*]?\s*:\s*\[(?P<type>[\w ]+)\]\s*$")
REFERENCE = "Reference: "  # the label `indexer.package_source.describe_key` writes before the docs' entry on a catalogue key
_TABLE_HEADER = re.compile(rf"^(?:{re.escape(REFERENCE.rstrip())}\s*)?(?:Fields|Field|Parameter|Description|Value|Key|Name)(?:;\s*\w+)+\s*$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[*])")
_ABBREVIATION_END = re.compile(r"\b(?:e\.g|i\.e|etc|vs|a\.k\.a|approx|Fig|No)\.$", re.I)
_IDENTIFIER = re.compile(r"^[A-Za-z_][\w.]*$")
_LINK = re.compile(r"\[\[?([^\]]*)\]?\]\([^)]*\)")  # a badge's empty text too, and a "[[slides]](...)" reference
_RST_DIRECTIVE = re.compile(r"^\.\. (\w+)::\s*")
_KEY_ROW = re.compile(r"^`?(?P<key>[a-z_][\w.]*)`?\s*:\s*\[(?P<type>[\w ]+)\];\s*(?P<rest>.+)$")
_VALUE = re.compile(r"^(?:`[^`]*`|-?\d[\w.]*|true|false|none|null|n/a|\{\}|\[\])\.?$", re.I)
_CLOSED = re.compile(r"""[.!?)\]"'`*]$""")
_STARTS_ANEW = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ`")
# a unit that ends on one of these words without punctuation runs on into code or a list it lacks
_RUNS_ON = frozenset("""a an the to of in on by with using use via call calls run runs set add as at for from
    following below like specifying specify and or is are be either then into this these""".split())
# of those, the words a sentence its author closed never ends on ("... are available at." once its
# link or reference is gone); "... the card you build it for." is whole
_NEVER_LAST = frozenset("a an the to of and or with via at following below".split())
# a sentence that ends on a colon points at what follows (a list, code, a figure) when it says so
_POINTS_AHEAD = re.compile(r"\b(?:following|below|example|examples|as follows|like this|here is|here are|e\.g|such as|these|this)\b", re.I)
_CODE_SPAN = re.compile(r"`[^`]*`")
# a row's sentence about an example the row does not hold ("An example, including the available dictionary
# keys is illustrated below.")
_SHOWN_BELOW = re.compile(r"(?<![^.!?\s])\s*[A-Z][^.!?]*\b(?:is|are) (?:illustrated|shown|given|listed) below\.", re.M)
# a statement before a colon whose object is what follows ("... you can do:", "... takes the form:")
_AS_FOLLOWS = re.compile(r"\s+(?:as follows|as shown below|like so)\s*\.$", re.I)  # points at code the unit does not hold
_POINTER = re.compile(r"\s*\((?:see|shown|as shown)\b[^()]*\b(?:below|above)\b[^()]*\)", re.I)
_COPULA = frozenset("is are was were be".split())
_POINTS_AT_WHAT_FOLLOWS = frozenset("do form need combining".split())
# a subordinate clause with no main clause before a colon ("When not using a DeepSpeed scheduler:" + a list;
# a short one only: a longer one mostly holds its main clause without a comma)
_CONDITION_ONLY = re.compile(r"^(?:when|whenever|if|unless|while|once)\b[^,]*$", re.I)
MIN_WORDS = 4
# a docstring's argument list: "Args:" and its kin open it, and each "name (type): what" line (or "name: what"
# under such a header) is an item of its own, kept whole up to ARG_WORDS so that its "Defaults to x." stays
# with its name instead of opening the next argument's sentence
_ARG_SECTION = re.compile(r"^(?:Args|Arguments|Parameters|Params|Keyword [Aa]rguments|Kwargs|Attributes|Returns|Raises|Yields)\s*:\s*$")
_ARG_LINE = re.compile(r"^(?P<name>\*{0,2}[a-z_]\w*)\s*(?P<type>\([^()]*(?:\([^()]*\)[^()]*)*\)|\{[^{}]*\})\s*:\s+(?P<what>\S.*)$")
_ARG_PLAIN = re.compile(r"^(?P<name>\*{0,2}[a-z_]\w*)\s*:\s+(?P<what>\S.*)$")
ARG_WORDS = 60
CAPTION_WORDS = 10  # a lone line this short, with no full stop, right above a table names it


@dataclass(frozen=True)
class Unit:
    text: str
    block: int  # paragraph/list/table block it came from: consecutive units of one block read on


# a caption: what a figure or table beside it shows ("Figure 3: ...", "Upper figure is ...", "Table 2: Training throughput ...")
_CAPTION = re.compile(r"^(?:figure|fig\.|image:)|^(?:the\s+)?(?:upper|lower|top|bottom|left|right|above|below)\s+"
                      r"(?:figure|image|plot|panel|chart|graph|table)\b|^table\s*\d+\s*[:.]", re.I)


_NAMED_FIRST = re.compile(r"^`?[\w.]+`?:\s+(?=api `)")


def _drop(unit: str) -> bool:
    words = unit.split()
    if len(words) < MIN_WORDS:
        return True
    low = _NAMED_FIRST.sub("", unit.lower())  # a member's name line joined to its stub ("`a.b.step`: API `a.b.step` in ...")
    # ":ivar training: ..." / ":vartype ...": a reST field list of attributes (torch's nn.Module one), not prose
    if " at 0x" in unit or "<function" in unit or low.startswith(("api `", "signature:", ":ivar ", ":vartype ")) or _CAPTION.match(unit):
        return True
    bare = _CODE_SPAN.sub("", unit)  # quotes inside `code` are a value named, not JSON
    if bare.count('"') >= 4 or ("{" in bare and '":' in bare):  # JSON outside a fence
        return True
    letters = sum(ch.isalpha() for ch in unit)
    return letters < 0.5 * len(unit.replace(" ", ""))  # mostly symbols: code or a formula


def _split_sentences(prose: str) -> list[str]:
    pieces = _SENTENCE_END.split(prose)
    out: list[str] = []
    for piece in pieces:
        if out and _ABBREVIATION_END.search(out[-1]):
            out[-1] = f"{out[-1]} {piece}"
        else:
            out.append(piece)
    return [p.strip() for p in out if p.strip()]


def _is_row(line: str, in_table: bool) -> bool:
    """A table row as the parser writes it (cells joined by '; '): under a header, or ending in a
    short value cell (a default such as `false`, 32, None). Prose with a semicolon is not a row."""
    cells = line.split("; ")
    if len(cells) < 2 or _LIST_ITEM.match(line):
        return False
    last = cells[-1].strip()
    return in_table or (len(last.split()) <= 3 and bool(_VALUE.match(last)))


def _is_sentence(cell: str) -> bool:
    """A cell that is a sentence, not a value (four words or more, a full stop, no code): the second half of a line of
    prose with a semicolon under a "Description; Default" header ("... therefore slower; subsequent generations
    replay them.")."""
    return "`" not in cell and len(cell.split()) >= 4 and cell.rstrip().endswith(".")


def _row_unit(cells: list[str], key: str | None, header: tuple[str, ...] = ()) -> str:
    """A table row with its key: 'group; Name for the group.; `None`' under `wandb`. Under a
    two-column header ("Description; Default") every cell but the last is the description when it
    reads as prose: a description may hold a semicolon of its own. A header naming its Description
    and Default columns says where they are ("Parameter; Type; Default; Description")."""
    cells = [c.strip() for c in cells if c.strip()]
    if len(cells) >= 3 and _IDENTIFIER.match(cells[0].strip("`")):
        name = cells[0].strip("`")
        full = f"{key}.{name}" if key and not name.startswith(key) else name
        if len(cells) == len(header) and {"Description", "Default"} <= set(header):
            desc, default = cells[header.index("Description")], cells[header.index("Default")]
        else:
            desc, default = "; ".join(cells[1:-1]), cells[-1]
    elif len(cells) == 2 or (len(header) == 2 and len(cells) > 2 and len(cells[0].split()) >= MIN_WORDS):
        full, desc, default = key or "", "; ".join(cells[:-1]), cells[-1]
    else:  # a matrix row without its header means little on its own
        return ""
    desc = _SHOWN_BELOW.sub("", desc).strip().rstrip(".")
    lead = f"`{full}`: " if full else ""
    # a table whose last column is "Example" ("Value; Example", "Fields; Value; Example") gives a value one
    # might set, not the default: `train_batch_size`'s 32 is no default of deepspeed's; another column ("Values",
    # "Status", "Conditions") says what it is named
    last = header[-1] if header and default == cells[-1] else "Default"
    said = "for example" if last == "Example" else "default" if last == "Default" else f"{last.lower()}:"
    return f"{lead}{desc} ({said} {default})."


def text_units(text: str, key: str | None = None) -> list[Unit]:
    """The quotable units of a passage, in reading order. `key`: the config key whose `key: [type]` line
    ended the chunk before (`open_key`), so that the rows of its table, here, keep it."""
    units: list[Unit] = []
    lone: int | None = None  # the unit a block of one short line without a full stop gave (a caption if a matrix follows)
    args_open = False
    for block_no, block in enumerate(re.split(r"\n\s*\n", _FENCE.sub("\n\n", inline_short_code(text)))):
        # (kind, text, key, header): prose | row | arg | whole (a matrix row read through its header), with the key
        # line and table header above a row as it was read
        items: list[tuple[str, str, str | None, tuple[str, ...]]] = []
        in_table = False  # a header row was seen in this block
        # under a docstring's "Args:" (or kin): in this block, or the block before ended on an argument (a blank line
        # between two arguments, as `deepspeed.initialize` writes them, is no end of the list)
        in_args = args_open
        header: tuple[str, ...] = ()  # the header's cells
        matrix: tuple[str, ...] = ()  # a matrix's header cells ("ZeRO stage; bf16_optimizer_states=False; ...=True")
        caption: int | None = None  # the item a lone short line without a full stop began (a table's caption)
        broke = False  # the line before ended in Markdown's hard break (a lone backslash)
        fields = opens_a_cause(block)  # a known cause's section of our notes: a line per field
        for raw in block.splitlines():
            line = _RST_DIRECTIVE.sub(lambda m: f"{m.group(1).capitalize()}: ", _LINK.sub(r"\1", raw.strip()))
            if not line:
                continue
            if fields and (as_read := reader_line(line)) is not None:
                if as_read:  # why, check and fix are a unit each; the texts it matches and its flags are the doctor's
                    items.append(("prose", as_read, key, header))
                continue
            after_break, broke = broke, line.endswith("\\") and not line.endswith("\\\\")
            line = line.removesuffix("\\").rstrip() if broke else line
            entry = CATALOGUE_ENTRY.match(line)
            key_line = _line_key(line)
            key_row = _KEY_ROW.match(line)
            if key_row:  # `key: [type]; description; default` on one line
                key = key_row.group("key")
                items.append(("row", key_row.group("rest"), key, header))
                continue
            if key_line:
                key = key_line
                continue
            if entry:
                key = entry.group("key")
                rest = entry.group("rest").strip()
                typed = f"`{key}` ({entry.group('type')}, default {entry.group('default')})"
                items.append(("prose", f"{typed}: {rest}" if rest else f"{typed}.", key, header))
                continue
            if _ARG_SECTION.match(line):
                in_args = True
                continue
            arg = _ARG_LINE.match(line) or (_ARG_PLAIN.match(line) if in_args else None)
            if arg:
                typed = f" {arg.group('type')}" if "type" in arg.groupdict() else ""  # (int, optional) or {'log', 'linear'}
                items.append(("arg", f"`{arg.group('name')}`{typed}: {arg.group('what')}", key, header))
                continue
            if _TABLE_HEADER.match(line):
                in_table, header = True, tuple(c.strip() for c in line.removeprefix(REFERENCE).split(";"))
                continue
            if line.startswith(REFERENCE):  # the docs' own entry under a catalogue key opens with prose: its own item
                items.append(("prose", line.removeprefix(REFERENCE), key, header))
                caption = None
                continue
            cells = line.split("; ")
            keyed = bool(_IDENTIFIER.match(cells[0].strip("`")))  # a key's row ("freeze_step; ...; 100000"): read as a row
            short = len(cells) >= 3 and all(len(c.split()) <= 4 for c in cells) and not keyed
            if short and not matrix and (not in_table or len(header) != len(cells)):
                matrix = tuple(c.strip() for c in cells)  # a matrix's header ("ZeRO stage; with offload; without offload")
                if caption is not None and caption == len(items) - 1:
                    items.pop()  # "Support matrix (bf16 master weights/gradients)": the title of what follows
                elif not items and lone is not None and lone == len(units) - 1:
                    units.pop()  # the same title as a paragraph of its own, just above
                caption = None
                continue
            ragged = bool(matrix) and 2 <= len(cells) < len(matrix)  # a matrix row whose last cells are empty ("0; Not supported")
            if (matrix and len(cells) >= 2 and not keyed and len(cells[0].split()) <= 4
                    and any(len(c.split()) >= (2 if ragged else 3) for c in cells[1:])):  # a row that says something, read through the header
                if ragged:
                    said = [f"{h}: {c.strip()}" for h, c in zip(matrix[1:], cells[1:], strict=False)]
                else:
                    said = [f"{h}: {c.strip()}" for h, c in zip(matrix[1:-1], cells[1:len(matrix) - 1], strict=True)]
                    said.append(f"{matrix[-1]}: {'; '.join(c.strip() for c in cells[len(matrix) - 1:])}")
                items.append(("whole", f"{matrix[0]} {cells[0].strip()} — {'; '.join(said)}", key, header))
                continue
            if ragged and not keyed:
                continue  # nothing alone, and no row of the key table above the matrix
            if short and not in_table:
                continue  # a matrix row of short cells (figures, yes/no): nothing alone
            if _is_row(line, in_table):
                prose = header[-1:] == ("Default",) and len(cells) == 2 and _is_sentence(cells[-1])
                items.append(("prose" if prose else "row", line, key, header))  # prose: a sentence of its own
                continue
            if _LIST_ITEM.match(line):
                items.append(("prose", _LIST_ITEM.sub("", line), key, header))
                caption = None
            elif items and items[-1][0] in ("prose", "arg"):
                # a wrapped line continues the item; after a hard break, a line that starts anew reads as what the
                # line before introduced ("Install DeepSpeed \\" then "`pip install deepspeed`")
                joint = ": " if after_break and not items[-1][1].endswith((".", "!", "?", ":")) and line[:1] in _STARTS_ANEW else " "
                items[-1] = (items[-1][0], f"{items[-1][1]}{joint}{line}", items[-1][2], items[-1][3])
                caption = None
            else:
                items.append(("prose", line, key, header))
                caption = len(items) - 1 if len(line.split()) <= CAPTION_WORDS and not line.endswith((".", "!", "?", ":")) else None
        args_open = in_args and bool(items) and items[-1][0] == "arg"
        for kind, item, row_key, row_header in items:
            flat = " ".join(item.split())
            if kind == "row":
                pieces = [_row_unit(item.split("; "), row_key, row_header)]
            elif (kind == "arg" and len(flat.split()) <= ARG_WORDS) or kind == "whole":
                pieces = [flat]
            else:
                pieces = _split_sentences(flat)
            for piece in pieces:
                finished = _finish(piece)
                if finished is not None and not _drop(finished):
                    units.append(Unit(finished, block_no))
        lone = len(units) - 1 if len(items) == 1 and caption == 0 and units and units[-1].block == block_no else None
    return units


_RST_LITERAL = re.compile(r"``([^`]+)``")
_BIB_REF = re.compile(r"\s*\[\d+(?:\s*[,\-\u2013]\s*\d+)*\]")


_RST_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|obj|data|exc|const):`~?([^`]+)`")


def inline_short_code(text: str) -> str:
    """A fence of one short line right after a line ending in a colon, read as that line's inline code: the
    sentence that says to run it keeps what it says to run (a longer block stays code, never a unit)."""
    return _SHORT_FENCE_AFTER_COLON.sub(lambda m: f"{m.group('line')} `{m.group('code')}`", text)


def markdown_literals(text: str) -> str:
    """reST's ``literal`` and a docstring's :class:`x` / :meth:`x` roles as Markdown's `code`, as a unit shows them."""
    return _RST_ROLE.sub(r"`\1`", _RST_LITERAL.sub(r"`\1`", text))


def _finish(unit: str) -> str | None:
    """A unit as a reader meets it: a leading identifier in backticks, a capital first letter, a
    closing full stop; None for one that trails off into code or a list it does not hold."""
    unit = markdown_literals(unit)
    cited = _BIB_REF.sub("", unit)  # a blog's "[14]" reads as one of the answer's citations
    referenced, unit = cited != unit, cited
    words = unit.split()
    if not words:
        return None
    last = words[-1].lower().rstrip(".")
    if last in (_RUNS_ON if referenced else _NEVER_LAST):  # "... are available at [14]." without its reference
        return None
    first = words[0].rstrip(",:;")
    if ("_" in first or "." in first[:-1]) and first[0].islower() and "`" not in first:
        unit = f"`{first}`{words[0][len(first):]} " + " ".join(words[1:])
    elif unit[0].islower():
        unit = unit[0].upper() + unit[1:]
    unit = unit.strip()
    unit = _POINTER.sub("", unit)  # "(see below)", "(see NOTE below for details)": the unit is quoted alone
    if (ahead := _AS_FOLLOWS.search(unit)) is not None:  # "... the optimizer options as follows." and no code after it
        head = unit[:ahead.start()].rstrip(" ,")
        if head.split()[-1].lower() in _COPULA:
            return None  # "The update rules are as follows.": nothing is left of it
        unit = head + "."
    if unit.endswith(":"):  # introduces a list, code or figure that is not part of the unit
        statement = unit.rstrip(":").rstrip()
        tail = statement.lower().split()[-2:]
        if (len(words) < 8 or _POINTS_AHEAD.search(statement) or tail[-1] in _RUNS_ON or tail[0] == "to"
                or tail[-1] in _POINTS_AT_WHAT_FOLLOWS or (len(words) <= 10 and _CONDITION_ONLY.match(statement))):
            return None
        unit = statement + "."  # a whole statement before its code: "... on every micro-batch:"
    if not _CLOSED.search(unit):
        if words[-1].lower().strip(",;") in _RUNS_ON:
            return None
        unit += "."
    return unit


# how a unit tells a catalogue key's type and default after its name, as `text_units` writes it: "(int, default 0)"
_TYPE_AND_DEFAULT = r"\([^()]*\bdefault [^()]*\)"
_BARE_ENTRY = re.compile(rf"^`(?P<key>[\w.]+)` {_TYPE_AND_DEFAULT}\.$")


def bare_entry_key(unit: str) -> str | None:
    """The key of a unit that is a catalogue entry with its type and default and nothing else
    ("`a.b` (int, default 0)."), as `text_units` writes one; None for any other unit."""
    m = _BARE_ENTRY.match(unit)
    return m.group("key") if m else None


_ARGUMENT_UNIT = re.compile(r"^`\*{0,2}(?P<name>[A-Za-z_]\w*)`(?: \([^)]*\)| \{[^}]*\})?: ")


def argument_unit(unit: str) -> tuple[str, str] | None:
    """(name, the rest after its name) of a docstring argument's unit as `text_units` writes one ("`tag` (str,
    optional): Checkpoint tag ..." -> ("tag", " (str, optional): Checkpoint tag ...")); None for any other unit."""
    m = _ARGUMENT_UNIT.match(unit)
    return (m.group("name"), unit[unit.index("`", 1) + 1:]) if m else None


def without_type_and_default(text: str, key: str) -> str:
    """`text` with the catalogue entry unit of `key` ("`a.b` (int, default 0): what it does", as `text_units`
    writes one) told without its type and default ("`a.b`: what it does"): for an answer whose Config line
    gives them already."""
    return re.sub(rf"`{re.escape(key)}` {_TYPE_AND_DEFAULT}: ", f"`{key}`: ", text)


def _line_key(line: str) -> str | None:
    """The key of a `key: [type]` line (`section:key` read as `section.key`), else None."""
    m = _KEY_LINE.match(line.strip())
    return m.group("key").replace(":", ".") if m else None


def open_key(text: str) -> str | None:
    """The config key a chunk ends on: its last line is the key's `key: [type]` line, whose table the
    chunker's word budget put in the next chunk (15 keys of config-json.md)."""
    lines = text.rstrip().splitlines()
    return _line_key(lines[-1]) if lines else None


def unit_table(chunks: list[Chunk]) -> tuple[list[list[Unit]], np.ndarray]:
    """Every chunk's units in chunk order (a chunk of a page goes on with the key its page's previous chunk
    ended on, `open_key`), and the offsets of each chunk's rows in the flat list of all units (one per
    chunk, plus the end)."""
    per_chunk = [text_units(chunk.text, open_key(before.text) if i and (before := chunks[i - 1]).path == chunk.path else None)
                 for i, chunk in enumerate(chunks)]
    return per_chunk, np.cumsum([0] + [len(u) for u in per_chunk]).astype(np.int64)
