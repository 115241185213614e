"""The installed deepspeed package as a source: public API docstrings and the config catalogue.

Both become ordinary Documents so the chunker and the retrievers treat them like the docs.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from indexer.api_signatures import Signature, signature_of
from indexer.config_catalogue import ConfigKey, build_catalogue, deepspeed_version
from indexer.documents import Block, Document, Section
from indexer.markdown import clean_prose, split_front_matter
from indexer.text_units import CATALOGUE_ENTRY, REFERENCE, markdown_literals

log = logging.getLogger(__name__)

# The public API users call. Classes list the methods to document; [] means all public ones.
API_SYMBOLS: dict[str, list[str] | None] = {
    "deepspeed.initialize": None,
    "deepspeed.init_inference": None,
    "deepspeed.init_distributed": None,
    "deepspeed.add_config_arguments": None,
    "deepspeed.runtime.engine.DeepSpeedEngine": [
        "forward", "backward", "step", "save_checkpoint", "load_checkpoint", "save_16bit_model",
        "zero_grad", "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "is_gradient_accumulation_boundary", "set_gradient_accumulation_boundary", "get_lr", "get_global_grad_norm",
        "offload_states", "reload_states", "no_sync", "compile", "empty_partition_cache", "destroy",
    ],
    "deepspeed.runtime.pipe.engine.PipelineEngine": ["train_batch", "eval_batch", "is_first_stage", "is_last_stage"],
    "deepspeed.zero.Init": [],
    "deepspeed.zero.GatheredParameters": [],
    "deepspeed.zero.register_external_parameter": None,
    "deepspeed.zero.unregister_external_parameter": None,
    "deepspeed.runtime.zero.offload_states.OffloadStateTypeEnum": None,
    "deepspeed.profiling.flops_profiler.FlopsProfiler": [],
    "deepspeed.profiling.flops_profiler.get_model_profile": None,
    "deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs_all_live": None,
    "deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold": None,
    "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs_all_live": None,
    "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs_all_cold": None,
    "deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint": None,
    "deepspeed.utils.zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict": None,
    "deepspeed.utils.zero_to_fp32.load_state_dict_from_zero_checkpoint": None,
    "deepspeed.checkpoint.ds_to_universal.main": None,
    "deepspeed.comm.init_distributed": None,
    "deepspeed.comm.all_reduce": None,
    "deepspeed.comm.all_gather": None,
    "deepspeed.comm.broadcast": None,
    "deepspeed.comm.barrier": None,
    "deepspeed.comm.get_rank": None,
    "deepspeed.comm.get_world_size": None,
    "deepspeed.comm.reduce_scatter_fn": None,
    "deepspeed.pipe.PipelineModule": [],
    "deepspeed.pipe.LayerSpec": [],
    "deepspeed.pipe.TiedLayerSpec": [],
    "deepspeed.utils.RepeatingLoader": [],
    "deepspeed.moe.layer.MoE": [],
    "deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer": None,
    "deepspeed.checkpointing.configure": None,
    "deepspeed.checkpointing.checkpoint": None,
    "deepspeed.ops.adam.DeepSpeedCPUAdam": [],
    "deepspeed.ops.adam.FusedAdam": [],
    "deepspeed.runtime.fp16.onebit.adam.OnebitAdam": [],
    "deepspeed.runtime.fp16.onebit.zoadam.ZeroOneAdam": [],
    "deepspeed.runtime.fp16.onebit.lamb.OnebitLamb": [],
    "deepspeed.sequence.layer.DistributedAttention": [],
    "deepspeed.ops.op_builder.AsyncIOBuilder": [],
}

API_PAGE_PREFIX = "deepspeed-api/"  # an API page's path: the prefix, then the symbol's dotted path
GITHUB_SRC = "https://github.com/deepspeedai/DeepSpeed/blob/v{version}/{path}#L{line}"
CONFIG_URL = "https://www.deepspeed.ai/docs/config-json/"
# an entry's name line: `<i>**name**</i>: [type]` or `***name***: [type]` (the page writes both)
_ENTRY = re.compile(r"^(?:<i>\*\*([\w:.\-]+)\*\*</i>|\*\*\*([\w:.\-]+)\*\*\*)\s*:?(.*)$")


def _resolve(path: str) -> Any:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def _signature(obj: Any, name: str) -> str:
    """`name(params)`, a default's memory address dropped (`<function checkpoint>`): it differs on
    every run and means nothing to a reader."""
    try:
        return _ADDRESS.sub(">", f"{name}{inspect.signature(obj)}")
    except (TypeError, ValueError):
        return name


def _source_url(obj: Any, version: str) -> str:
    try:
        file = Path(inspect.getsourcefile(obj) or "")
        line = inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return f"https://github.com/deepspeedai/DeepSpeed/tree/v{version}"
    parts = file.parts
    rel = "/".join(parts[parts.index("deepspeed") :]) if "deepspeed" in parts else file.name
    return GITHUB_SRC.format(version=version, path=rel, line=line)


_DIRECTIVE = re.compile(r"^\s*\.\. (?:code-block|code|sourcecode)::")


_EXAMPLE_HEADER = re.compile(r"^\s*(?:Examples?|Usage|Example usage)\s*::?\s*$", re.I)


def _is_code(para: str) -> bool:
    """An indented docstring paragraph is an example when it is a `>>>` session or parses as Python;
    an indented `name: description` argument list is prose."""
    body = inspect.cleandoc(para)
    if body.lstrip().startswith(">>>"):
        return True
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return False
    # `name: Type` lines alone are an argument list that happens to parse
    return not all(isinstance(node, ast.AnnAssign) and node.value is None for node in tree.body)


def _doc_blocks(doc: str) -> list[Block]:
    """A docstring as prose paragraphs; indented example blocks stay whole as code."""
    blocks: list[Block] = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        if _DIRECTIVE.match(para):  # `.. code-block:: python` and its `:option:` lines are markup, not code
            lines = para.splitlines()[1:]
            while lines and re.match(r"^\s*:[\w-]+:", lines[0]):
                lines.pop(0)
            para = "\n".join(lines)
        if not para.strip():
            continue
        lines = para.splitlines()
        if all(line.startswith(("    ", ">>>", "...")) or not line.strip() for line in lines) and _is_code(para):
            blocks.append(Block(kind="code", text=inspect.cleandoc(para), language="python"))
            continue
        # an "Example:" with its >>> session right under the argument list, no blank line between: the session is code
        first = next((i for i, line in enumerate(lines) if line.lstrip().startswith(">>>")), None)
        head = lines if first is None else lines[:first]
        if head and first is not None and _EXAMPLE_HEADER.match(head[-1]):
            head = head[:-1]
        if "\n".join(head).strip():
            blocks.append(Block(kind="text", text="\n".join(head).strip()))
        if first is not None:
            blocks.append(Block(kind="code", text=inspect.cleandoc("\n".join(lines[first:])), language="python"))
    return blocks


# what the docs' API reference documents: `.. autoclass:: deepspeed.runtime.lr_schedules.WarmupDecayLR` (a module's
# whole `automodule` is left to the symbols above)
_AUTODOC = re.compile(r"^\.\. auto(?:class|function|method|attribute)::\s*(deepspeed(?:\.\w+)+)\s*$", re.M)


def documented_symbols(docs_root: Path | None) -> dict[str, list[str] | None]:
    """API_SYMBOLS, then every symbol the docs' reST API reference (`docs/code-docs/source`) pulls in with
    autodoc and API_SYMBOLS does not name: the docstring alone (`None`), its methods left to their own
    directives. Without a docs checkout, API_SYMBOLS."""
    symbols = dict(API_SYMBOLS)
    source = docs_root / "docs" / "code-docs" / "source" if docs_root is not None else None
    for rst in sorted(source.glob("**/*.rst")) if source is not None and source.is_dir() else []:
        for path in _AUTODOC.findall(rst.read_text(encoding="utf-8", errors="replace")):
            symbols.setdefault(path, None)
    return symbols


def _own(cls: type, name: str) -> bool:
    """Whether a class's member is deepspeed's own: defined by a deepspeed class of its MRO, not inherited
    from torch (`MoE.compile`, `PipelineModule.register_forward_hook`: 170 of 243 "all public methods" were
    torch.nn.Module's and torch.optim.Optimizer's, with torch's docstrings)."""
    owner = next((c for c in cls.__mro__ if name in c.__dict__), None)
    return owner is not None and owner.__module__.startswith("deepspeed")


def _deepspeeds(cls: type) -> bool:
    return cls.__module__.startswith("deepspeed")


def own_doc(member: Any, cls: type | None = None, name: str = "") -> str:
    """The docstring deepspeed wrote for an API member, never one inherited from torch (`inspect.getdoc` gives a
    class or method without its own the base class's: TiledLinear read "Base class for all neural network
    modules", DeepSpeedCPUAdam "Base class for all optimizers"). A class without its own docstring gives its
    own `__init__`'s (GatheredParameters, zero.Init had none), else a deepspeed base class's; a method of `cls`
    (`name`) the first docstring of that name along `cls`'s MRO, when a deepspeed class wrote it."""
    if inspect.isclass(member):
        own = member.__dict__.get("__doc__") or getattr(member.__dict__.get("__init__"), "__doc__", None)
        owner = next((c for c in member.__mro__ if c.__dict__.get("__doc__")), None)
        doc = own or (owner.__doc__ if owner is not None and _deepspeeds(owner) else None)
    elif cls is not None and name:
        owner = next((c for c in cls.__mro__ if getattr(c.__dict__.get(name), "__doc__", None)), None)
        doc = getattr(owner.__dict__[name], "__doc__", None) if owner is not None and _deepspeeds(owner) else None
    else:
        doc = getattr(member, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else ""


def api_members(symbols: dict[str, list[str] | None] | None = None) -> Iterator[tuple[str, Any, list[tuple[str, Any]]]]:
    """Per symbol of `symbols` (API_SYMBOLS by default) the installed deepspeed has: its path, the object,
    and the members documented with it, (qualified name, object), the symbol first, then a class's listed
    methods (for `[]`, all public ones deepspeed defines). A symbol it lacks is logged and left out, and so is one another
    symbol already documents (`deepspeed.DeepSpeedEngine.step` is `deepspeed.runtime.engine.DeepSpeedEngine.step`)."""
    seen: set[int] = set()
    for path, methods in (API_SYMBOLS if symbols is None else symbols).items():
        try:
            obj = _resolve(path)
        except (ImportError, AttributeError) as exc:
            log.info("API symbol %s not in deepspeed %s: %s", path, deepspeed_version(), exc)
            continue
        if path not in API_SYMBOLS and (id(obj) in seen or inspect.ismodule(obj)):
            continue
        members: list[tuple[str, Any]] = [(path, obj)]
        if inspect.isclass(obj) and methods is not None:
            names = methods or [n for n, _ in inspect.getmembers(obj, callable) if not n.startswith("_") and _own(obj, n)]
            members += [(f"{path}.{n}", getattr(obj, n)) for n in names if hasattr(obj, n)]
        seen.update(id(member) for _, member in members)
        yield path, obj, members


def read_api_docs(docs_root: Path | None = None) -> list[Document]:
    """The API pages: API_SYMBOLS and what the docs' API reference adds (`documented_symbols`)."""
    version = deepspeed_version()
    docs: list[Document] = []
    for path, obj, members in api_members(documented_symbols(docs_root)):
        short = path.rsplit(".", 1)[-1]
        sections: list[Section] = []
        for qual, member in members:
            doc = own_doc(member, obj if inspect.isclass(obj) and member is not obj else None, qual.rsplit(".", 1)[-1])
            if member is not obj and not doc:
                continue
            blocks = [Block(kind="text", text=f"API `{qual}` in deepspeed {version}. Signature: `{_signature(member, qual.rsplit('.', 1)[-1])}`")]
            blocks += _doc_blocks(doc) if doc else []
            sections.append(Section(heading=qual, trail=(f"deepspeed API: {short}", qual), anchor="", blocks=blocks))
        if sections:
            docs.append(
                Document(
                    path=f"{API_PAGE_PREFIX}{path}",
                    title=f"deepspeed API: {path}",
                    url=_source_url(obj, version),
                    source="api",
                    sections=sections,
                    meta={"topic": "api"},
                )
            )
    return docs


def api_signatures(symbols: dict[str, list[str] | None] | None = None) -> list[Signature]:
    """The keyword arguments of every member the API pages document (`api_members`; `indexer/api_signatures.py`)."""
    return [sig for _, _, members in api_members(symbols) for qual, member in members
            if (sig := signature_of(member, qual)) is not None]


def config_reference_prose(docs_root: Path | None) -> dict[str, str]:
    """Entries of docs/_pages/config-json.md, keyed by their name (e.g. 'fp16:loss_scale')."""
    if docs_root is None:
        return {}
    page = docs_root / "docs" / "_pages" / "config-json.md"
    if not page.is_file():
        return {}
    _, body = split_front_matter(page.read_text(encoding="utf-8"))
    entries: dict[str, list[str]] = {}
    seen: dict[str, int] = {}
    current: str | None = None
    for line in body.splitlines():
        m = _ENTRY.match(line.strip())
        if m:
            current = m.group(1) or m.group(2)
            seen[current] = seen.get(current, 0) + 1
            entries.setdefault(current, [])
            continue
        if line.startswith("#"):
            current = None
        elif current is not None:
            entries[current].append(line)
    # a bare name the page uses in several sections ("enabled") belongs to none of them for sure
    return {k: clean_prose("\n".join(v)) for k, v in entries.items() if seen[k] == 1 and any(s.strip() for s in v)}


def _prose_for(key: ConfigKey, prose: dict[str, str]) -> str:
    parts = key.path.split(".")
    for name in (":".join(parts), ":".join(parts[1:]), key.name, *key.aliases):
        if name and name in prose:
            return prose[name]
    return ""


def describe_key(key: ConfigKey, prose: dict[str, str]) -> str:
    facts = [f"type {key.type}", f"default {key.default}"]
    if key.aliases:
        facts.append("also accepted as " + ", ".join(key.aliases))
    text = f"`{key.path}` ({'; '.join(facts)})."
    if key.deprecated:
        text += f" Deprecated: use `{key.deprecated}` instead." if key.deprecated != "deprecated" else " Deprecated."
    if key.removed:
        text += f" Removed in deepspeed {deepspeed_version()}: {key.removed}"
    if key.doc:
        text += " " + " ".join(key.doc.split())
    reference = _prose_for(key, prose)
    if reference:
        text += "\n" + REFERENCE + reference
    return text


def key_facts(text: str) -> dict[str, tuple[str, str]]:
    """Path -> (type, default) of every key a config passage describes (the lines `describe_key`
    writes, read with the one pattern the text units use), so the service reads the catalogue from
    its index without importing deepspeed."""
    facts = {}
    for m in map(CATALOGUE_ENTRY.match, text.splitlines()):
        if m:
            facts[m.group("key")] = (m.group("type"), m.group("default").split("; also accepted as ")[0])
    return facts


def key_descriptions(text: str) -> dict[str, str]:
    """Path -> what a config passage says a key does: the installed deepspeed's own text after the
    key's facts, else the description cell of the docs' reference row under it ("Reference:
    Description; Default" then "<description>; <default>"); keys with neither are left out."""
    lines = text.splitlines()
    out = {}
    for i, m in enumerate(map(CATALOGUE_ENTRY.match, lines)):
        if m is None:
            continue
        said = m.group("rest").strip()
        if not said and i + 2 < len(lines) and lines[i + 1].startswith(REFERENCE + "Description; Default"):
            said = lines[i + 2].rsplit("; ", 1)[0].strip()
        if said:
            out[m.group("key")] = markdown_literals(said)
    return out


_STATUS = re.compile(r"Deprecated: use `(?P<new>[\w.]+)` instead\.|(?P<bare>Deprecated\.)|Removed in deepspeed (?P<version>[\w.+-]+): (?P<message>[^\n]*)")


def key_status(text: str) -> dict[str, str]:
    """Path -> what the installed deepspeed says of a key that is deprecated or removed ("removed in
    deepspeed 0.19.8: <its message>", "deprecated: use `x` instead"), read from the lines
    `describe_key` writes; keys in good standing are left out."""
    status = {}
    for m in map(CATALOGUE_ENTRY.match, text.splitlines()):
        found = _STATUS.search(m.group("rest")) if m else None
        if m is None or found is None:
            continue
        if found.group("version"):
            status[m.group("key")] = f"removed in deepspeed {found.group('version')}: {found.group('message').strip()}"
        elif found.group("new"):
            status[m.group("key")] = f"deprecated: use `{found.group('new')}` instead"
        else:
            status[m.group("key")] = "deprecated"
    return status


def read_config_catalogue(docs_root: Path | None) -> list[Document]:
    """One document per top-level section; each key a block, so a chunk holds a key group."""
    version = deepspeed_version()
    prose = config_reference_prose(docs_root)
    by_section: dict[str, list[ConfigKey]] = {}
    for key in build_catalogue():
        by_section.setdefault(key.section, []).append(key)
    docs: list[Document] = []
    for section, keys in sorted(by_section.items()):
        blocks = [Block(kind="text", text=describe_key(k, prose)) for k in keys]
        title = f"DeepSpeed config: {section}"
        docs.append(
            Document(
                path=f"deepspeed-config/{section}",
                title=title,
                url=CONFIG_URL,
                source="config",
                sections=[Section(heading=section, trail=(title, f"config keys checked against deepspeed {version}"), anchor="", blocks=blocks)],
                meta={"topic": "config"},
            )
        )
    return docs
