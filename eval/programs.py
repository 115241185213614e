"""Turn a snippet into a program that exercises it for real, or a reasoned `skip`.

- ds_config: `eval/config_program.py`; python: `eval/python_program.py`.
- launcher / hostfile (here): the `deepspeed` launcher on localhost with a tiny training script (one
  process on CPU, `--num_gpus` up to the GPUs there are on a GPU host); placeholders filled, named.
"""

from __future__ import annotations

import json
import sys

from eval.config_program import BASE_CONFIG, prepare_ds_config
from eval.prepared import Prepared, driver
from eval.python_program import prepare_python
from eval.requirements import CPU_RANKS, Capabilities
from eval.sandbox import free_port
from indexer.launcher_line import hostfile_hosts, include_slots, launcher_lines, names_hostfile, parse_filled

RUNNABLE_KINDS = ("ds_config", "python", "launcher", "hostfile")
ONE_NODE = "more nodes need hosts reachable by ssh"
# the launcher on this machine alone: a localhost hostfile, no ssh check, and the master address given
# (without it the launcher asks the first host for its address over ssh)
LOCAL_HOSTFILE_WORDS = ["--hostfile", "hostfile", "--no_ssh_check", "--master_addr", "127.0.0.1"]


# --------------------------------------------------------------------------- launcher

def prepare_launcher(code: str, caps: Capabilities, *, hostfile: bool = False) -> Prepared:
    adaptations: list[str] = []
    if hostfile:
        hosts = hostfile_hosts(code)
        if not hosts:
            return Prepared(skip="no 'host slots=N' line")
        host, slots = hosts[0]
        want = slots if caps.cuda else 1
        n = min(want, caps.gpus) if caps.cuda else 1
        if len(hosts) > 1:
            adaptations.append(f"hostfile of {len(hosts)} hosts -> 'localhost slots={n}' (one node, this machine: {ONE_NODE})")
        else:
            adaptations.append(f"hostfile '{host} slots={slots}' -> 'localhost slots={n}' (this machine)")
        files = {"hostfile": f"localhost slots={n}\n"}
        words = ["deepspeed", *LOCAL_HOSTFILE_WORDS, "train.py"]
        launcher_words = words
    else:
        try:
            lines = launcher_lines(code)
        except ValueError as exc:
            return Prepared(skip=f"the command line does not split: {exc}")
        if not lines:
            return Prepared(skip="no `deepspeed` launcher line (torchrun, srun and mpirun are not run)")
        args, err, launcher_words, filled = parse_filled(lines[0])
        adaptations += filled
        if args is None:
            return Prepared(files={"err.txt": err}, argv=[sys.executable, "-c", f"import sys; sys.exit({json.dumps('deepspeed launcher rejected the line: ' + err)})"])
        if args.module or args.no_python:
            return Prepared(skip="runs a module or a non-Python program (--module / --no_python): nothing of ours to substitute")
        if args.bind_core_list and "<" in args.bind_core_list:
            return Prepared(skip=f"--bind_core_list {args.bind_core_list} is a placeholder: which cores to bind is the reader's to fill in")
        files = {}
        words = ["deepspeed"]
        for flag in ("master_port", "bind_cores_to_rank", "bind_core_list", "log_level", "enable_each_rank_log"):
            v = getattr(args, flag, None)
            if flag == "master_port" and any(n.startswith("placeholder --master_port") for n in filled):
                v = free_port()
                adaptations.append(f"--master_port: a free port ({v})")
            if v not in (None, False, "", -1) and f"--{flag}" in " ".join(launcher_words):
                words += [f"--{flag}"] if v is True else [f"--{flag}", str(v)]
        wanted = args.num_gpus if args.num_gpus and args.num_gpus > 0 else include_slots(args.include)
        if caps.cuda:
            n = wanted or caps.gpus
            words += ["--num_gpus", str(min(n, caps.gpus))]
        elif wanted and 1 < wanted <= CPU_RANKS:
            words += ["--num_gpus", str(wanted)]
            if "--master_port" not in words:
                words += ["--master_port", str(free_port())]
            adaptations.append(f"{wanted} CPU processes over gloo in place of {wanted} GPUs (--num_gpus {wanted})")
        else:
            words += ["--num_gpus", "1"]
            if args.num_gpus != 1:
                adaptations.append("one process on CPU (--num_gpus 1)")
        if names_hostfile(launcher_words):
            n = min(wanted or caps.gpus, caps.gpus) if caps.cuda else 1
            files["hostfile"] = f"localhost slots={n}\n"
            words += LOCAL_HOSTFILE_WORDS
            named = "(a placeholder)" if any(a.startswith(("placeholder --hostfile", "placeholder -H")) for a in filled) else args.hostfile
            adaptations.append(f"the hostfile {named} (not in the snippet) -> 'localhost slots={n}' (one node, this machine: {ONE_NODE})")
        if args.num_nodes and args.num_nodes > 1:
            adaptations.append(f"one node (this machine) in place of --num_nodes {args.num_nodes}: {ONE_NODE}")
        if args.master_addr and args.master_addr not in ("localhost", "127.0.0.1"):
            adaptations.append(f"--master_addr {args.master_addr} -> this machine (the launcher's default)")
        words.append("train.py")
        if args.user_script != "train.py":
            adaptations.append(f"user script {args.user_script} -> dsqa's tiny training script (its arguments kept for parsing)")
        if "--fp16" in args.user_args and not caps.cuda:
            adaptations.append("--fp16 is the user script's flag: the tiny script in its place trains in fp32 (fp16 needs a GPU)")
        words += list(args.user_args)
    files["train.py"] = driver("tiny_train.py")
    files["ds_config.json"] = json.dumps({**BASE_CONFIG, "steps_per_print": 1})
    argv = [sys.executable, "-m", "deepspeed.launcher.runner", *words[1:]]
    return Prepared(files=files, argv=argv, adaptations=adaptations)


def prepare(kind: str, code: str, caps: Capabilities, context: str = "") -> Prepared:
    if kind == "ds_config":
        prepared = prepare_ds_config(code, caps)
    elif kind == "python":
        prepared = prepare_python(code, caps, context)
    elif kind in ("launcher", "hostfile"):
        prepared = prepare_launcher(code, caps, hostfile=kind == "hostfile")
    else:
        return Prepared(skip=f"{kind} snippets are not run")
    if not prepared.skip:  # every driver imports it first: an uncaught error ends the run at once
        prepared.files["exit_on_error.py"] = driver("exit_on_error.py")
    return prepared
