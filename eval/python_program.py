"""A Python snippet as a program: run as `snippet.py` with a prelude that supplies the names doc
fragments assume (`model`, `optimizer`, `engine`, `args`, `data_loader`...; see `PRELUDE_NAMES`)
only when the snippet loads them without binding or importing them (found with `ast`), and the
imports its page made in earlier snippets; `>>>` prompts are stripped, elision lines run as `pass`,
and printed output pasted after the code is left out.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import json
import re
import sys
import textwrap

from eval.prepared import Prepared, driver
from eval.requirements import (
    Capabilities,
    hub_stand_in,
    python_requirements,
)
from indexer.python_check import PUBLIC_NAMESPACES, printed_output_cut, strip_repl

# names a doc fragment may use without defining them; supplied by drivers/prelude.py
PRELUDE_NAMES = frozenset(
    {
        "model", "net", "optimizer", "engine", "model_engine", "ds_engine", "args", "cmd_args", "ds_config",
        "config", "ds_config_path", "config_path", "data_loader", "dataloader", "train_loader", "trainloader",
        "train_dataloader", "dataset", "train_dataset", "training_data", "batch", "inputs", "labels", "x", "y",
        "loss", "criterion", "loss_fn", "lr_scheduler", "scheduler", "device", "local_rank", "rank", "world_size",
        "save_dir", "ckpt_dir", "checkpoint_dir", "load_dir", "ckpt_id", "tag", "client_sd", "client_state",
        "step", "epoch", "parameters", "model_parameters", "params", "mpu", "torch", "deepspeed", "nn", "np",
        "os", "sys", "json", "math", "time", "argparse", "dist", "get_accelerator", "F",
        "self", "module", "parser", "get_argument_parser", "micro_batch_size", "sequence_parallel_size", "trainset", "cifar_trainset",
        "dtype", "data_iter", "tensor", "chunk_size", "output_dir", "output_file", "random",
        "Model", "MyLargeModel", "Net", "weight_shape", "num_features",  # `model = Model()`: the tiny model's class
        "optimizer_grouped_parameters", "optimizer_parameters", "param_groups", "grouped_parameters",
    }
)
# where a name a fragment neither defines nor imports is looked up, after earlier imports on its page:
# deepspeed's public namespaces, the ZeRO offload enums the ZeRO-3 page uses, and typing's annotations
FRAGMENT_NAMESPACES = (*PUBLIC_NAMESPACES, "deepspeed.runtime.zero.offload_config", "typing")


def free_names(tree: ast.Module) -> list[str]:
    """Names the code loads but never binds, imports or gets from builtins (scope-insensitive)."""
    bound: set[str] = set(dir(builtins)) | {"__name__", "__file__", "__doc__", "__builtins__"}
    loaded: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store | ast.Del):
                bound.add(node.id)
            elif node.id not in loaded:
                loaded.append(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                bound.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
            if not isinstance(node, ast.ClassDef):
                args = node.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                    if arg is not None:
                        bound.add(arg.arg)
        elif isinstance(node, ast.Lambda):
            for arg in node.args.args:
                bound.add(arg.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound.update(node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            pass
    free = [n for n in loaded if n not in bound]
    return free + [n for n in _read_before_written(tree) if n not in free and n not in dir(builtins)]


def _read_before_written(tree: ast.Module) -> list[str]:
    """Names a top-level statement reads before any earlier statement binds them (`model = model.eval()`
    takes `model` from the page), in order; compound statements and definitions are left out."""
    bound: set[str] = set()
    early: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.Expr):
            value = stmt.value
            if isinstance(stmt, ast.AugAssign):  # `x += 1` reads x first
                value = ast.Tuple(elts=[stmt.target, stmt.value], ctx=ast.Load())
            for node in ast.walk(value) if value is not None else ():
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound and node.id not in early:
                    early.append(node.id)
                if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
                    break  # their own variables are not the page's
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                bound.add(node.id)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
    return early


def import_lines(code: str) -> list[str]:
    """The top-level import statements of a Python snippet (none when it does not parse)."""
    src = strip_repl(code)
    try:
        tree = ast.parse(textwrap.dedent(src if src is not None else code))
    except SyntaxError:
        return []
    return [ast.unparse(node) for node in tree.body
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0)]


def _context_imports(context: str, wanted: set[str]) -> dict[str, str]:
    """Name -> the import line (from earlier on the page, or deepspeed's public namespaces) that
    binds it; only import statements are ever taken from the context."""
    found: dict[str, str] = {}
    for line in context.splitlines():
        try:
            node = ast.parse(line).body[0]
        except (SyntaxError, IndexError):
            continue
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for alias in node.names:
            name = (alias.asname or alias.name).split(".")[0]
            if name in wanted and name not in found:
                found[name] = line
    for name in sorted(wanted - set(found)):
        for space in FRAGMENT_NAMESPACES:
            if _public_callable(space, name):
                found[name] = f"from {space} import {name}"
                break
    return found


def _public_callable(space: str, name: str) -> bool:
    try:
        module = importlib.import_module(space)
    except Exception:  # noqa: BLE001
        return False
    return callable(getattr(module, name, None))


# the readers of a saved ZeRO checkpoint (deepspeed.utils.zero_to_fp32), and the prelude's names for its folder
_ZERO_CHECKPOINT_READER = re.compile(r"\b(?:get_fp32_state_dict_from_zero_checkpoint|load_state_dict_from_zero_checkpoint|"
                                     r"convert_zero_checkpoint_to_fp32_state_dict)\s*\(")
CHECKPOINT_FOLDERS = frozenset({"save_dir", "ckpt_dir", "checkpoint_dir", "load_dir"})
ENGINE_NAMES = frozenset({"engine", "model_engine", "ds_engine"})
BATCH_NAMES = frozenset({"batch", "data_loader", "dataloader", "train_loader", "trainloader", "train_dataloader", "data_iter"})
_HF_CALL = re.compile(r"\(\s*\*\*\s*batch\s*\)")  # model(**batch), model_engine(**batch)
_TENSOR_BATCH = re.compile(r"\bbatch\.(split|chunk)\s*\(")  # a batch cut into micro-batches: one tensor, not a tuple
# an engine call that only a ZeRO optimizer serves: moving its states off the device and back, and the loss scaling of a
# manual `loss.backward()` (deepspeed refuses a direct tensor.backward() under ZeRO stage 0)
_ZERO_ENGINE_CALL = re.compile(r"\b(?:engine|model_engine|ds_engine)\.(offload_states|reload_states|scale|coalesce_grad_reduction)\s*\(")
# a call only deepspeed's pipeline engine serves: the pipeline tutorial's loops, on an engine or on one built from `model`/`net`
_PIPELINE_CALL = re.compile(r"\.(train_batch|eval_batch)\s*\(")
COUNT_ARGS = frozenset({"args", "cmd_args"})

_ELISION = re.compile(r"^(\s*)(?:\.{2,}|…|\[\.\.\.\]|#\s*\.\.\.)\s*$")


def elisions_as_pass(src: str) -> str:
    """A doc excerpt's elision lines (`......`, `…`, `[...]`) as `pass`, indentation kept, tabs as
    spaces: the rest of the excerpt then parses as written."""
    return "\n".join(_ELISION.sub(r"\1pass", line) for line in src.expandtabs(4).splitlines())


def counts_read(tree: ast.Module, supplied: set[str]) -> list[str]:
    """The attributes of the prelude's argparse namespace a fragment reads as a count, `range(args.steps)`:
    its page's own command-line flags, which the namespace does not have."""
    found = [n.args[0].attr for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "range" and n.args
             and isinstance(n.args[0], ast.Attribute) and isinstance(n.args[0].value, ast.Name)
             and n.args[0].value.id in COUNT_ARGS & supplied]
    return list(dict.fromkeys(found))


def returns_at_top(tree: ast.Module) -> bool:
    """A `return` (or `yield`) outside any function: an excerpt of a function's body (a method's `return y`)."""
    def walk(node: ast.AST) -> bool:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                continue
            if isinstance(child, ast.Return | ast.Yield | ast.YieldFrom) or walk(child):
                return True
        return False
    return walk(tree)


def as_function_body(src: str, tree: ast.Module) -> str:
    """A function-body excerpt run as the body of a function called once; the names it reads still come
    from the module's globals (the prelude's), `global` lines kept for those it binds at the top."""
    bound = sorted({t.id for n in tree.body if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign)
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)})
    head = f"    global {', '.join(bound)}\n" if bound else ""
    return "def _excerpt():\n" + head + textwrap.indent(src, "    ") + "\n\n\n_excerpt()\n"


def prepare_python(code: str, caps: Capabilities, context: str = "") -> Prepared:
    typed = strip_repl(code)
    src = textwrap.dedent(typed if typed is not None else code)
    adaptations: list[str] = []
    try:
        tree = ast.parse(src)
    except SyntaxError as exc:
        repaired = elisions_as_pass(src)
        try:
            tree = ast.parse(repaired)
        except SyntaxError:
            cut = printed_output_cut(src)
            if cut is None:
                return Prepared(skip=f"fragment: not complete Python (line {exc.lineno}: {exc.msg})")
            last = len(src.splitlines())
            src, first = cut
            tree = ast.parse(src)
            adaptations.append(f"lines {first}-{last} are what the prints show, pasted after the code: not run")
        else:
            src = repaired
            adaptations.append("elided lines ('......') run as `pass`")
    if any(isinstance(n, ast.Call) and any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in [*n.args, *(k.value for k in n.keywords)])
           for n in ast.walk(tree)):
        return Prepared(skip="fragment: '...' placeholders in a call")
    names = free_names(tree)
    imported = _context_imports(context, {n for n in names if n not in PRELUDE_NAMES})
    if imported:
        src = "\n".join(dict.fromkeys(imported.values())) + "\n" + src
        adaptations.append("imports from earlier on its page: " + "; ".join(dict.fromkeys(imported.values())))
        names = [n for n in names if n not in imported]
    unknown = [n for n in names if n not in PRELUDE_NAMES]
    if unknown:
        return Prepared(skip=f"fragment: uses names it does not define and the prelude does not supply: {', '.join(unknown[:6])}")
    supplied = [n for n in names if n in PRELUDE_NAMES]
    stand_ins: dict[str, str] = {}  # Hub ids the run builds at toy size, each at a local path the snippet now names
    for req in python_requirements(src, tree):
        family = hub_stand_in(req.subject) if req.name == "network" and req.subject else None
        if family and not caps.cuda:
            local = "hub/" + re.sub(r"[^\w.-]", "__", req.subject)
            src = re.sub(rf"([\"']){re.escape(req.subject)}\1", f"\\g<1>{local}\\g<1>", src)
            stand_ins[local] = family
            adaptations.append(f"'{req.subject}' -> a tiny {family} of random weights (2 layers, width 32; MiniLM's WordPiece "
                               "tokenizer) built offline: the calls run, what the model outputs means nothing")
    inference = bool(re.search(r"\binit_inference\(", src))  # `config` there is an inference config, not a training one
    # a fragment that reads back a ZeRO checkpoint from a folder the prelude names, saved by an earlier step of its page
    given = set(supplied)
    saved_checkpoint = bool(_ZERO_CHECKPOINT_READER.search(src)) and "save_checkpoint" not in src and bool(CHECKPOINT_FOLDERS & given)
    plan = {"names": supplied, "client_optimizer": "optimizer=" in src, "device": caps.device, "inference": inference,
            "config_in_call": bool(re.search(r"\b(?:config|config_params)\s*=", src))}  # then args carries no config path
    plan["stand_ins"] = stand_ins
    plan["saved_checkpoint"] = saved_checkpoint
    # engine methods a ZeRO optimizer brings (the prelude's engine otherwise runs stage 0 with torch's AdamW)
    needs_zero = sorted(set(_ZERO_ENGINE_CALL.findall(src))) if given & ENGINE_NAMES else []
    plan["zero_stage"] = 1 if needs_zero else 0
    # a Hugging Face style call on the prelude's batch: model(**batch).loss
    plan["hf_batches"] = bool(_HF_CALL.search(src)) and bool(given & BATCH_NAMES)
    plan["tensor_batches"] = not plan["hf_batches"] and bool(_TENSOR_BATCH.search(src)) and bool(given & BATCH_NAMES)
    pipeline = sorted(set(_PIPELINE_CALL.findall(src))) if given & (ENGINE_NAMES | {"model", "net"}) else []
    plan["pipeline"] = bool(pipeline)
    plan["arg_counts"] = arg_counts = counts_read(tree, given)
    plan["mpu_grid"] = "mpu" in given and bool(re.search(r"\bmpu\.\w+\s*\(", src))
    if returns_at_top(tree):
        src = as_function_body(src, tree)
        adaptations.append("an excerpt of a function's body (it returns): run as the body of a function called once")
    files = {"snippet.py": src, "prelude.py": driver("prelude.py"), "plan.json": json.dumps(plan), "main.py": driver("python_main.py")}
    if stand_ins:
        files["hub_stand_in.py"] = driver("hub_stand_in.py")
    adaptations += [f"prelude supplied: {', '.join(supplied)}"] if supplied else []
    if needs_zero:
        adaptations.append(f"the prelude's engine runs ZeRO stage 1 (its default is stage 0): {', '.join(f'`{m}`' for m in needs_zero)} "
                           f"{'needs' if len(needs_zero) == 1 else 'need'} a ZeRO optimizer")
    if plan["tensor_batches"]:
        adaptations.append("the prelude's batches are single tensors (inputs and targets side by side), which its tiny model "
                           "answers with the loss: the batch is cut with .split/.chunk and each piece passed to the model alone")
    if plan["hf_batches"]:
        adaptations.append("the prelude's batches are dicts of input_ids and labels, and its tiny model answers model(**batch) "
                           "with .loss and .logits, as a Hugging Face model does")
    if pipeline:
        adaptations.append(f"the prelude's model is a PipelineModule of the tiny model's layers (one stage, MSE loss) and its engine "
                           f"deepspeed's PipelineEngine: {', '.join(f'`{m}`' for m in pipeline)} {'is' if len(pipeline) == 1 else 'are'} "
                           "the pipeline engine's")
    for name in arg_counts:
        adaptations.append(f"args.{name} (its page's own command-line flag, read as a count) set to 2")
    if plan["mpu_grid"]:
        adaptations.append("mpu: deepspeed's PipelineParallelGrid over one process (pipe, model and data parallel size 1)")
    if saved_checkpoint:
        adaptations.append("a real ZeRO stage 2 checkpoint of the prelude's tiny model (one training step) saved to 'checkpoints', "
                           "tag 'step0', before the snippet: the state an earlier step of its page writes")
    if inference and {"config", "ds_config"} & set(supplied):
        adaptations.append("the prelude's config for init_inference is empty (the inference defaults)" if caps.cuda else
                           "the prelude's config for init_inference sets dtype fp32 (its default, fp16, needs a GPU)")
    return Prepared(files=files, argv=[sys.executable, "main.py"], adaptations=adaptations)
