"""The error doctor over the installed deepspeed's error catalogue: the errors are ones deepspeed
0.19.8 itself raised when `dsqa verify` ran the docs' snippets; each must be matched exactly to the
line that raises it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.catalogue_match import catalogue_for, leading_matches
from app.doctor import diagnose, raised_line
from app.error_log import extract_error, versions_in, without_traceback
from indexer.error_catalogue import build_error_catalogue

RAISED = [  # (the log's last lines, the file and function that raise it)
    ("deepspeed.runtime.config.DeepSpeedConfigError: MiCS ZeRO-3 sharding has been removed; 'zero_optimization.mics_shard_size' "
     "is no longer supported. See https://github.com/deepspeedai/DeepSpeed/issues/8489.", "deepspeed/runtime/config.py"),
    ("ValueError: Muon and reduce scatter cannot be used together", "deepspeed/runtime/zero/stage3.py"),
    ("AssertionError: results_dir cannot be empty", "deepspeed/autotuning/config.py"),
    ("AssertionError: OneBitAdam is not a supported DeepSpeed Optimizer", "deepspeed/runtime/engine.py"),
    ("ValueError: 'max_grad_norm' is not supported as an optimizer parameter, please switch to using the deepspeed parameter "
     "'gradient_clipping' see: https://www.deepspeed.ai/docs/config-json/#gradient-clipping for more details", "deepspeed/runtime/engine.py"),
    ("deepspeed.runtime.config.DeepSpeedConfigError: The DeepSpeed compression library has been removed. A leftover "
     "'compression_training' block would be ignored and the model would train unquantized. See "
     "https://github.com/deepspeedai/DeepSpeed/issues/8489.", "deepspeed/runtime/config.py"),
    ("deepspeed.utils.exceptions.DeprecatedException: Please do not use the groups.initialize() API as it is deprecated. "
     "Instead, pass the desired ep_size to deepspeed.moe.layer.MoE(..,ep_size,..)", "deepspeed/utils/groups.py"),
]


def test_the_catalogue_holds_nearly_every_message_with_a_pattern() -> None:
    entries = build_error_catalogue()
    with_pattern = sum(1 for e in entries if e.pattern)
    print(f"\n{len(entries)} messages, {with_pattern} with a pattern")
    assert len(entries) > 1000 and with_pattern / len(entries) >= 0.9


def catalogue_of(tmp_path, name: str, source: str) -> list:  # noqa: ANN001
    """The error catalogue of a one-module `deepspeed` package holding `source`."""
    package = tmp_path / "deepspeed"
    package.mkdir()
    (package / name).write_text(source)
    return build_error_catalogue(package)


def test_a_message_assigned_to_a_local_name_first_is_catalogued(tmp_path) -> None:  # noqa: ANN001
    source = ("def configure(opt):\n"
              "    msg = 'unused here'\n"
              "    if opt:\n"
              "        msg = f'You are using ZeRO-Offload with a client provided optimizer ({type(opt)}) which is slow.'\n"
              "        msg += ' Set zero_force_ds_cpu_optimizer to false to go on.'\n"
              "        raise RuntimeError(msg)\n"
              "    raise ValueError(msg)\n")
    entries = {e.exception: e for e in catalogue_of(tmp_path, "engine.py", source)}
    assert entries["RuntimeError"].template == ("You are using ZeRO-Offload with a client provided optimizer ({}) which is slow. "
                                                 "Set zero_force_ds_cpu_optimizer to false to go on.")
    assert entries["RuntimeError"].function == "configure" and entries["RuntimeError"].line == 6
    assert entries["ValueError"].template == "You are using ZeRO-Offload with a client provided optimizer ({}) which is slow. " \
        "Set zero_force_ds_cpu_optimizer to false to go on."  # the last assignment before the raising line


def test_each_message_of_a_conditional_is_catalogued_and_matches_without_its_full_stop(tmp_path) -> None:  # noqa: ANN001
    import re

    entries = catalogue_of(tmp_path, "auto_tp.py",
                           "def tp_parser(model, injectable):\n"
                           "    assert model.ok, 'AutoTP cannot split this model. Use kernel injection instead.' if injectable \\\n"
                           "        else 'AutoTP cannot split this model. Please provide a policy.'\n")
    assert [e.template for e in entries] == ["AutoTP cannot split this model. Use kernel injection instead.",
                                             "AutoTP cannot split this model. Please provide a policy."]
    assert {e.function for e in entries} == {"tp_parser"}
    assert re.search(entries[0].pattern, "AutoTP cannot split this model. Use kernel injection instead")  # quoted without it
    assert not re.search(entries[1].pattern, "AutoTP cannot split this model. Use kernel injection instead")


def test_a_class_name_field_matches_only_the_raising_class_and_its_subclasses(tmp_path) -> None:  # noqa: ANN001
    """`raise AttributeError(f"'{type(self).__name__}' object ...")` in a class: its pattern takes that class
    and deepspeed's subclasses of it, not any class (Python words its own AttributeError the same way), and
    the doctor calls such a message neither exact nor near that line."""
    import re

    source = ("class DeepSpeedEngine:\n"
              "    def __getattr__(self, name):\n"
              "        raise AttributeError(f\"'{type(self).__name__}' object has no attribute '{name}'\")\n"
              "class PipelineEngine(DeepSpeedEngine):\n"
              "    pass\n")
    (entry,) = catalogue_of(tmp_path, "engine.py", source)
    assert entry.template == "'{}' object has no attribute '{}'" and entry.classes == ("DeepSpeedEngine", "PipelineEngine")
    assert re.search(entry.pattern, "'PipelineEngine' object has no attribute 'set_batch_fn'")
    assert not re.search(entry.pattern, "'DummyOptim' object has no attribute 'step'")
    shipped = {e.path: e for e in build_error_catalogue() if e.template == "'{}' object has no attribute '{}'"}
    assert "DeepSpeedEngine" in shipped["deepspeed/runtime/engine.py"].classes
    assert diagnose("AttributeError: 'DummyOptim' object has no attribute 'step'").matched not in ("exact", "nearest")
    assert diagnose("AttributeError: 'DeepSpeedEngine' object has no attribute 'text_model'").matched == "exact"


def test_a_close_known_text_keeps_its_names_and_a_follow_up_gives_way_to_the_line_that_failed() -> None:
    """A known text is close to a message that holds most of its words in order and every name it holds
    ('DeepSpeedEngine'); a known text marked `(follow-up)` in the message ("Error building extension")
    goes after the cause the log shows on an earlier line (the linker's "cannot find -lcurand")."""
    from app.doctor import close_known_match
    from corpus import NOTES_DIR
    from indexer.known_causes import parse_known_causes, read_known_causes

    known = read_known_causes(NOTES_DIR)
    other_class = close_known_match(known, "AttributeError: 'DummyOptim' object has no attribute 'step'")
    assert other_class is None or "DeepSpeedEngine" not in other_class[1]
    close = close_known_match(known, "RuntimeError: tensors must be 2-D")
    assert close is not None and "2-D" in close[1]
    (parsed,) = parse_known_causes("## Build\nMatches: `Error building extension` (follow-up) | `Python.h: No such file`\nFix: f\n")
    assert parsed.matches == ("Error building extension", "Python.h: No such file") and parsed.follow_ups == {"Error building extension"}
    log = ("/usr/bin/ld: cannot find -lcurand\ncollect2: error: ld returned 1 exit status\nninja: build stopped: subcommand failed.\n"
           "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nRuntimeError: Error building extension 'cpu_adam'")
    titles = [c.title for c in diagnose(log, known=known).causes]
    assert "CUDA toolkit are missing" in titles[0] and any("compiler or headers" in t for t in titles[1:]), titles
    alone = diagnose("RuntimeError: Error building extension 'cpu_adam'", known=known)
    assert "compiler or headers" in alone.causes[0].title
    # the message names the compiler's cause only by its follow-up, but the log shows that cause's own line
    # too, nearer the error than a CUDA-version line another cause matches: the nearer one leads
    headers = ("Installed CUDA version 12.1 does not match the version torch was compiled with 11.8 but since the APIs are "
               "compatible, accepting this combination\nBuilding extension module cpu_adam...\n"
               "python_headers.h:12:10: fatal error: Python.h: No such file or directory\nninja: build stopped: subcommand failed.\n"
               "RuntimeError: Error building extension 'cpu_adam'")
    titles = [c.title for c in diagnose(headers, known=known).causes]
    assert "compiler or headers" in titles[0] and any("CUDA toolkit and torch disagree" in t for t in titles[1:]), titles


def test_an_error_quoted_in_prose_or_a_cut_off_traceback_is_still_read() -> None:
    """A chat message that quotes the exception inline; a traceback pasted without its last line, which
    stops where deepspeed calls the function that raised; a message followed by another frame's code."""
    prose = ("With nvme offload we get the `RuntimeError: Unable to JIT load the async_io op due to it not being compatible` "
             "error, libaio-dev is installed.")
    assert extract_error(prose) == ("RuntimeError", "Unable to JIT load the async_io op due to it not being compatible")
    cut = ("Traceback (most recent call last):\n"
           '  File "/opt/venv/lib/python3.10/site-packages/deepspeed/launcher/runner.py", line 349, in parse_inclusion_exclusion\n'
           "    return parse_resource_filter(active_resources, include_str=inclusion, exclude_str=exclusion)\n")
    result = diagnose(cut)
    assert result.matched == "nearest", result.to_json()
    assert "deepspeed/launcher/runner.py" in result.causes[0].source_url and "`parse_resource_filter`" in result.causes[0].explanation
    assert diagnose(cut.replace("deepspeed/launcher", "mylib/launcher")).matched != "nearest"  # not deepspeed's frame
    log = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:784, unhandled system error\n    model = init_deepspeed(self)\n"
    assert extract_error(log) == ("RuntimeError", "NCCL error in: ProcessGroupNCCL.cpp:784, unhandled system error")


def test_a_short_generic_pattern_gives_way_to_a_longer_message_reworded_across_versions() -> None:
    """An older release's wording (no "DeepSpeed Op Builder:" prefix) matches only a generic "{} does not
    match {}" pattern exactly; the builder's own check, close in words, comes first."""
    log = ("Exception: Installed CUDA version 11.0 does not match the version torch was compiled with 10.1, unable to "
           "compile cuda/cpp extensions without a matching cuda version.")
    result = diagnose(log)
    assert result.matched == "exact" and "deepspeed/ops/op_builder/builder.py" in result.causes[0].source_url, result.to_json()


def test_python_s_own_message_that_ends_in_a_deepspeed_message_is_not_that_line() -> None:
    """deepspeed's indexed dataset raises IndexError("index out of range"); Python's "tuple index out of range"
    holds those words as the end of its own sentence and once matched that line exactly (three tune-only logs,
    none of them from that dataset), as "partially initialized module 'x' has no attribute 'y'" (a circular
    import) holds "module {} has no attribute {}". Neither is the line, exactly or by its words."""
    own = diagnose("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nIndexError: tuple index out of range")
    assert not any("indexed_dataset.py" in c.source_url for c in own.causes), own.to_json()
    theirs = diagnose("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nIndexError: index out of range")
    assert theirs.matched == "exact" and "indexed_dataset.py" in theirs.causes[0].source_url, theirs.to_json()
    circular = diagnose("AttributeError: partially initialized module 'torch' has no attribute 'cuda' (most likely due to a circular import)")
    assert not any(c.title.startswith("AttributeError: module {}") for c in circular.causes), circular.to_json()


def test_a_message_pasted_without_its_later_sentences_is_matched_to_its_line() -> None:
    """Only the first sentence of ZeRO's "already been reduced" assertion (its other two sentences cut):
    before, `nearest` took a shorter message that shares most of its words ("Parameter has already been
    quantized.", a quantization utility); a first sentence that ends in a hole takes one word there, not
    the question after it."""
    result = diagnose("AssertionError: The parameter 12 has already been reduced.")
    assert result.matched == "nearest" and "has already been reduced. Gradient computed twice" in result.causes[0].title, result.to_json()
    assert "deepspeed/runtime/zero/stage_1_and_2.py" in result.causes[0].source_url
    assert "the start of this one" in result.causes[0].explanation
    assert "quantized" in diagnose("AssertionError: Parameter has already been quantized.").causes[0].title  # its own line still
    _, catalogue = catalogue_for(None)
    asked = "The checkpoint being loaded used a DP world size of 8 but the current world size is 16. Is there any way around it"
    assert leading_matches(asked, catalogue) == []


def test_an_answer_quotes_where_an_exact_message_is_raised() -> None:
    """`/ask` leads with this line when a question quotes a message deepspeed raises word for word; an
    assert's test is what must hold, so it reads "unless ... holds", not "when"."""
    line = raised_line(diagnose("AssertionError: allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 4"))
    assert line.startswith("Raised by `__init__` in deepspeed/runtime/zero/stage_1_and_2.py unless `allgather_bucket_size")
    assert "holds" in line and "Fix: check `allgather_bucket_size`" in line and "/blob/v0.19.8/" in line and line.endswith(").\n")
    assert raised_line(diagnose("ValueError: my own script failed here")) == ""  # nothing deepspeed raises word for word


def test_an_answer_names_a_known_failure_the_message_shows() -> None:
    """torch's "CUDA out of memory" is no message deepspeed raises; `/ask` answered it with the CUDA version
    mismatch passage. A message that holds a known failure's text gets its name, the first sentence of why and
    the fix, cited to our notes; not where the caller asks for deepspeed's own lines only."""
    from corpus import NOTES_DIR
    from indexer.known_causes import read_known_causes

    known = read_known_causes(NOTES_DIR)
    oom = diagnose("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", known=known)
    line = raised_line(oom)
    assert line.startswith("CUDA out of memory during training: ") and ". Fix: " in line
    assert "(source: dsqa://notes/known-errors#cuda-out-of-memory" in line and len(line.split()) < 160
    why = line.split(". Fix: ")[0]
    assert why.count(". ") == 0  # one sentence of why: the doctor gives the rest
    assert raised_line(oom, known_failures=False) == ""
    build = raised_line(diagnose("RuntimeError: Error building extension 'cpu_adam'", known=known))
    assert build.startswith("An op fails to build: compiler or headers missing (cpu_adam, fused_adam). Fix: ")  # a long why: left out
    batch = diagnose("AssertionError: Check batch related parameters. train_batch_size is not equal to "
                     "micro_batch_per_gpu * gradient_acc_step * world_size 32 != 4 * 2 * 8", known=known)
    assert raised_line(batch).startswith("The batch sizes do not add up")  # a known failure first, deepspeed's line cited
    assert "/blob/v0.19.8/deepspeed/runtime/config.py" in raised_line(batch, known_failures=False)
    # the note's example config is for other figures: the one these figures give stands in its place
    assert batch.causes[0].fix.endswith('Config: {"train_batch_size": 64}') and batch.causes[0].fix.count("Config:") == 1


@pytest.mark.parametrize(("line", "path"), RAISED, ids=[p[0].split(":")[0].rsplit(".", 1)[-1] + str(i) for i, p in enumerate(RAISED)])
def test_errors_deepspeed_raised_are_matched_to_their_line(line: str, path: str) -> None:
    log = "\n".join(["[rank3]: Traceback (most recent call last):", '[rank3]:   File "train.py", line 12, in <module>',
                     "[rank3]:     engine, *_ = deepspeed.initialize(model=model, config=cfg)", f"[rank3]: \x1b[31m{line}\x1b[0m"])
    result = diagnose(log)
    assert result.matched == "exact", result.to_json()
    assert path in result.causes[0].source_url and "/blob/v0.19.8/" in result.causes[0].source_url


def test_extraction_reads_through_ranks_colours_and_versions() -> None:
    log = "ds_report: deepspeed version 0.16.4, torch version 2.5.1\n[rank0]: \x1b[1mAssertionError: results_dir cannot be empty\x1b[0m\n"
    assert extract_error(log) == ("AssertionError", "results_dir cannot be empty")
    assert versions_in(log) == {"deepspeed": "0.16.4", "torch": "2.5.1"}
    assert "from deepspeed 0.16.4" in diagnose(log).causes[0].explanation  # another version than the catalogue's


def test_a_destructors_echo_is_not_the_error() -> None:
    # deepspeed.initialize fails; the half-built engine's __del__ then fails too, and Python prints that last
    log = """Traceback (most recent call last):
  File "train.py", line 30, in <module>
    engine, *_ = deepspeed.initialize(model=model, config="ds.json")
[rank0]: AssertionError: Micro batch size per gpu: 0 has to be greater than 0
Exception ignored in: <function DeepSpeedEngine.__del__ at 0x7f3a2c1d5e10>
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 512, in __del__
    self.destroy()
AttributeError: 'DeepSpeedEngine' object has no attribute '_deepcompile_active'
"""
    assert extract_error(log) == ("AssertionError", "Micro batch size per gpu: 0 has to be greater than 0")
    echo_only = log[log.index("Exception ignored"):]
    assert extract_error(echo_only) == ("AttributeError", "'DeepSpeedEngine' object has no attribute '_deepcompile_active'")
    # nor does the echo's text bring a known cause ("'DeepSpeedEngine' object has no attribute": the engine wrapper's)
    from corpus import NOTES_DIR
    from indexer.known_causes import read_known_causes

    causes = diagnose(log, known=read_known_causes(NOTES_DIR)).causes
    assert not any("DeepSpeedEngine" in c.title or "destructor" in c.title for c in causes), [c.title for c in causes]


def test_a_traceback_without_its_machinery_is_the_error_line_and_the_words_around_it() -> None:
    log = ("my job died:\nTraceback (most recent call last):\n  File \"train.py\", line 5, in <module>\n    main()\n"
           "[rank1]: RuntimeError: boom happened\n 45%|####      | 9/20\nany idea?")
    assert without_traceback(log).split("\n") == ["my job died:", "RuntimeError: boom happened", "any idea?"]


def test_a_chinese_locale_machine_s_shell_and_system_messages_are_read_in_english() -> None:
    """bash and the C library print their own messages in the machine's language; the catalogue and the
    known causes are in English."""
    from corpus import NOTES_DIR
    from indexer.known_causes import read_known_causes

    known = read_known_causes(NOTES_DIR)
    port = diagnose("RuntimeError: The server socket has failed to bind to [::]:29500 (errno: 98 - 地址已在使用).", known=known)
    assert port.error["message"].endswith("(errno: 98 - Address already in use).")
    launcher = diagnose("bash: deepspeed: 未找到命令", known=known)
    assert launcher.error["message"] == "bash: deepspeed: command not found" and launcher.matched == "exact"
    assert "deepspeed" in launcher.causes[0].title.lower() and "not found" in launcher.causes[0].title.lower()
    disk = diagnose("OSError: [Errno 28] 设备上没有空间", known=known)
    assert disk.matched == "exact" and "disk" in disk.causes[0].title.lower()
    remote = diagnose("node1: bash: -c: 行 0: 未预期的符号“(”附近有语法错误", known=known)
    assert "syntax error near unexpected token" in remote.error["message"] and remote.causes[0].title.startswith("pdsh launch")


def test_an_unexplained_error_from_deepspeed_s_own_code_or_an_older_release_points_at_the_release() -> None:
    """No catalogue line and no known cause explains the message: when the traceback ends inside
    deepspeed's code, or the log names an older deepspeed, the first cause is that release's bug (upgrade,
    or the version the project pins); an unknown error from the user's own code gets no such guess."""
    inside = ('Traceback (most recent call last):\n  File "/opt/venv/lib/python3.10/site-packages/deepspeed/runtime/engine.py", '
              'line 1201, in _configure_checkpointing\n    group = self.optimizer.dp_process_group\n'
              "AttributeError: 'NoneType' object has no attribute 'dp_process_group_xyz'\n")
    first = diagnose(inside).causes[0]
    assert "deepspeed/runtime/engine.py (_configure_checkpointing)" in first.explanation
    assert "Upgrade DeepSpeed" in first.fix and "pin" in first.fix
    older = diagnose("deepspeed 0.5.9, torch 1.10.0\nRuntimeError: slice() cannot be applied to a 0-dim tensor xyz\n").causes[0]
    assert "likely a bug of deepspeed 0.5.9" in older.title
    own = diagnose('Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
                   "ValueError: the widget count xyz must be even\n").causes[0]
    assert own.title == "no DeepSpeed error recognised"


def test_a_follow_up_the_log_shows_away_from_the_error_gives_way_to_a_cause_beside_it() -> None:
    """Missing required arguments only report that the script got no settings; a launch script whose
    continuations broke (its option lines run as commands) says why, so it leads, though its text is
    shorter and neither is in the last failing line."""
    from corpus import NOTES_DIR
    from indexer.known_causes import read_known_causes

    known = read_known_causes(NOTES_DIR)
    log = ("train.py: error: the following arguments are required: --model_name_or_path, --output_dir\n"
           "run.sh: line 3: --model_name_or_path: command not found\nrun.sh: line 4: --bf16: command not found\n")
    assert "line continuations are broken" in diagnose(log, known=known).causes[0].title
    alone = diagnose("train.py: error: the following arguments are required: --output_dir\n", known=known)
    assert "settings file as its one argument" in alone.causes[0].title


def test_a_plain_exception_line_or_the_last_failing_line_is_the_error() -> None:
    """`raise Exception(...)` prints a bare `Exception:` line, and a progress bar after it is not the
    error; a log with no exception line gives the last line that says something failed, not a trailing
    version number, a logged warning or a bare label."""
    log = ("OVERFLOW! Rank 0 Skipping step.\nException: Current loss scale already at minimum - cannot decrease scale anymore. "
           "Exiting run.\n  4%|4         | 17/387 [05:25<1:57:56, 19.13s/it]\n")
    assert extract_error(log) == ("Exception", "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.")
    assert diagnose(log).matched == "exact"
    no_exception = ("[WARNING] [runner.py:201:fetch_hostfile] Unable to find hostfile, will proceed with local resources only.\n"
                    "install failed: No such file or directory: '/usr/local/cuda/bin/nvcc'\nerror:\nnvcc version\n11.7\n")
    assert extract_error(no_exception) == ("", "install failed: No such file or directory: '/usr/local/cuda/bin/nvcc'")
    assert extract_error("[WARNING] Unable to find hostfile, will proceed\nstep 10 loss 2.1\n") == ("", "step 10 loss 2.1")


@pytest.mark.parametrize("log", ["", "   \n\n", "\x00\x01\x02" * 1000, "x" * 3_000_000])
def test_junk_and_huge_logs_get_a_clear_reply(log: str) -> None:
    result = diagnose(log)
    assert result.matched in ("none", "nearest", "exact") and result.causes


def test_diagnose_route(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.small_index import build_small_index, small_app

    with TestClient(small_app(build_small_index(tmp_path_factory))) as http:
        r = http.post("/diagnose", json={"log": RAISED[1][0]})
        assert r.status_code == 200 and r.json()["matched"] == "exact" and r.json()["causes"][0]["source_url"].endswith("#L361")
        assert http.post("/diagnose", json={"log": ""}).status_code == 422


def test_a_harmless_warning_beside_an_error_is_listed_after_its_causes() -> None:
    """A log that shows a harmless warning (`Harmless: yes`) and then fails: the failure's causes come
    first and the warning is still named, last; a log whose error is unknown says so before the warning;
    the warning pasted alone is explained first. A field that is not yes/no is refused."""
    from corpus import NOTES_DIR
    from indexer.known_causes import parse_known_causes, read_known_causes

    known = read_known_causes(NOTES_DIR)
    warning = ("/usr/lib/python3/site-packages/deepspeed/runtime/zero/linear.py:49: FutureWarning: "
               "`torch.cuda.amp.custom_fwd(args...)` is deprecated. Please use `torch.amp.custom_fwd(args..., device_type='cuda')` instead.")
    batch = ("AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
             "gradient_acc_step * world_size 256 != 2 * 18 * 7")
    failed = diagnose("\n".join([warning, "Traceback (most recent call last):", '  File "train.py", line 3, in <module>', batch]), known=known)
    titles = [c.title for c in failed.causes]
    assert "batch" in titles[0].lower() and titles[-1] == "FutureWarning spam about torch.cuda.amp.custom_fwd"
    unknown = diagnose("\n".join([warning, "RuntimeError: the frobnicator lost its way"]), known=known)
    assert unknown.causes[0].title == "no DeepSpeed error recognised"
    assert unknown.causes[-1].title == "FutureWarning spam about torch.cuda.amp.custom_fwd"
    alone = diagnose(warning, known=known)
    assert alone.causes[0].title == "FutureWarning spam about torch.cuda.amp.custom_fwd"
    assert sum(k.harmless for k in known) >= 6
    with pytest.raises(ValueError, match="Harmless is yes or no"):
        parse_known_causes("## A\nMatches: `x`\nFix: y\nHarmless: sometimes\n")


def test_a_log_that_only_says_it_hangs_gets_the_causes_of_a_stall() -> None:
    """No exception and no known text, but the log says the job stopped: the known causes marked
    `Hangs: yes` come first, the one whose telling words the log shares first (P2P for consumer cards
    stuck in the first collective, the ZeRO-3 all-gather for a py-spy dump inside generate). The same
    words beside a real exception leave the exception's own diagnosis alone."""
    from corpus import NOTES_DIR
    from indexer.known_causes import parse_known_causes, read_known_causes

    known = read_known_causes(NOTES_DIR)
    assert sum(k.hangs for k in known) >= 8
    p2p = diagnose("\n".join([
        "# 8x RTX 4090 in one box, deepspeed --num_gpus 8 train.py",
        "[INFO] [comm.py:668:init_distributed] Initializing TorchBackend in DeepSpeed with backend nccl",
        "nothing after this line, the GPUs show 100% utilisation and the job hangs forever"]), known=known)
    assert p2p.causes[0].title.startswith("Multi-GPU run hangs at the first collective on consumer GPUs")
    assert "says the job stopped" in p2p.causes[0].explanation
    dump = diagnose("\n".join([
        "# ZeRO-3 model, model.generate on every rank after training; a rank is stuck, py-spy dump:",
        "Thread 0x00007f57caf71740 (most recent call first):",
        '  File "/opt/env/lib/python3.10/site-packages/deepspeed/runtime/zero/partitioned_param_coordinator.py", line 300 in fetch_sub_module',
        '  File "/opt/env/lib/python3.10/site-packages/transformers/generation/utils.py", line 2400 in generate']), known=known)
    assert dump.causes[0].title.startswith("ZeRO-3 ranks hang in a parameter all-gather")
    raised = diagnose("\n".join(["# it hangs for a minute, then:", "RuntimeError: the frobnicator lost its way"]), known=known)
    assert raised.causes[0].title == "no DeepSpeed error recognised"
    with pytest.raises(ValueError, match="Hangs is yes or no"):
        parse_known_causes("## A\nMatches: `x`\nFix: y\nHangs: maybe\n")


def test_known_causes_parse_and_their_config_fixes_validate() -> None:
    from corpus import NOTES_DIR
    from indexer.config_check import validate_config
    from indexer.known_causes import read_known_causes

    known = read_known_causes(NOTES_DIR)
    assert len(known) >= 15 and len({k.title for k in known}) == len(known)
    for k in known:
        assert k.matches and k.why and k.fix and k.url.startswith("dsqa://notes/known-errors#")
        if k.config is not None:
            report = validate_config(k.config)
            assert report.valid, (k.title, [f.message for f in report.errors])


def test_real_error_logs_are_labelled_against_the_installed_source() -> None:
    """Each log of the set, and of the tune-only set, names the deepspeed file and function that raise its
    message in 0.19.8; the two sets share no id and no thread."""
    import importlib.util
    import json
    from pathlib import Path

    from eval.doctor_eval import ERROR_LOGS, TUNE_ONLY_LOGS, all_error_logs, load_error_logs

    logs = all_error_logs()
    package = Path(next(iter(importlib.util.find_spec("deepspeed").submodule_search_locations)))  # type: ignore[union-attr]
    assert len(load_error_logs()) >= 60 and len(logs) >= 180 and len({log.id for log in logs}) == len(logs)
    threads = [{json.loads(line)["origin"] for line in f.read_text(encoding="utf-8").splitlines() if line.strip()} for f in (ERROR_LOGS, TUNE_ONLY_LOGS)]
    assert not threads[0] & threads[1] and len(threads[1]) == len(load_error_logs(TUNE_ONLY_LOGS, tune_only=True))
    raised = [log for log in logs if log.raised_in_deepspeed]
    assert len(raised) >= 80
    for log in raised:
        source = (package / log.gold_file).read_text(encoding="utf-8")
        assert f"def {log.gold_function}(" in source, log.id


def test_doctor_on_real_error_logs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Stop 54 added 21 logs from threads no set had used (err-141..161; 14 fell in test by the id hash), scored
    before anything was written for them: 11 right (tune 5 of 7, test 6 of 14); two sections for the two tune
    misses (an engine method on a model DeepSpeed never wrapped; a closure passed to accelerate's optimizer
    wrapper) moved no test log. Test is now 66 logs, 69.7% without retrieval (46) and the floor below follows it
    (tune 96.4% of 56). Before, measured at landing on the test half of 101 real error logs (nothing was chosen on it): the first cause
    names the thread's cause in 76.9% of 52 (tune: 95.9% of 49; the 548 tune-only logs: 92.7%; with batches J and K's 68 fresh ones, 616: 89.4%), up from 75.0% at stop 41
    by stop 42's sections for the tune-only misses, from 73.1% at stop 40 by what stop 41's 116 tune-only logs showed, from 65.4%
    at stop 37 and 53.8% at stop 36 by what stop 37's and stop 38's tune-only logs showed (see tests/test_quality.py). The 37 logs added last (err-101..) were
    scored before anything was written for them: 35.1% (tune half 37.5%, test half 33.3%); then eight
    sections for their tune half's causes (Accelerate's "auto", ninja, numactl, a new DeepSpeed on an old
    torch, get_last_lr under fp16 overflow, ...) moved none of the test half. On the first 64 logs' test half:
    67.7% (tune: 100%) since five sections name what their tune misses showed users call the cause (the DPO
    reference model under ZeRO stage 2, SIGKILL for host memory, PyTorch 2.0 dropping torch._six, a multi-node
    hostfile); 58.1% (tune 78.8%) before, with 168 known-cause sections and with 118 (the 50 added last
    moved no test log; 54.8% with 76, 51.6% with 54, 48.4% with 38, 41.9% with 21; the 134 added since were
    mined from other users' threads, never from this set or its threads; the catalogue alone: 16.1%),
    the raising line is among the first three in 88.0% (22 of 25) of the test logs deepspeed raises (first 64: 94.1%, 16 of 17; 82.4% before
    the catalogue read a message assigned to a local name first, `msg = f"..."; raise X(msg)`; tune: 82.6%
    -> 91.3%; raise/assert alone: 76.5%)."""
    from app.doctor import diagnose_with
    from corpus import NOTES_DIR
    from eval.doctor_eval import load_error_logs, score_doctor
    from indexer.config_catalogue import deepspeed_version
    from indexer.error_catalogue import ERRORS_FILE, build_error_catalogue, write_error_catalogue

    folder = tmp_path_factory.mktemp("errors")
    entries = build_error_catalogue()
    write_error_catalogue(folder / ERRORS_FILE, entries)
    by_url = {e.url(deepspeed_version()): e for e in entries}
    report = score_doctor(load_error_logs(), lambda log: diagnose_with(folder, None, log, NOTES_DIR), by_url)
    print(report["tune"], report["test"])
    assert report["test"]["logs"] >= 60 and report["test"]["cause_at_1"] >= 0.68 and report["test"]["source_in_3"] >= 0.85
    assert report["tune"]["cause_at_1"] >= 0.9


def test_warming_reads_the_catalogue_a_diagnosis_reads() -> None:
    """`Engine.warm` reads and compiles the error catalogue (`warm_catalogue`), so a server's first pasted
    error finds it read: the diagnosis after it reads nothing more."""
    from app.catalogue_match import _catalogue, _compiled, warm_catalogue

    warm_catalogue(None)
    read, compiled = _catalogue.cache_info().misses, _compiled.cache_info().misses
    diagnose("AssertionError: The parameter 12 has already been reduced.")
    assert (_catalogue.cache_info().misses, _compiled.cache_info().misses) == (read, compiled)


def test_a_diagnosis_from_an_index_names_its_catalogue_version_without_importing_deepspeed(tmp_path) -> None:
    """The raising line's URL and the version notes name the release the index's catalogue was read from (its
    first line), and a diagnosis no longer imports deepspeed to ask the installed one: that import (and
    torch's) made a server's first pasted error take about 2 s more than the next (bench: 1-client p99 1.86 s
    against a p50 of 28 ms)."""
    import json
    import subprocess
    import sys
    from dataclasses import asdict

    from indexer.error_catalogue import ERRORS_FILE, RaisedError

    entry = RaisedError("AssertionError", "The parameter {} has already been reduced.", r"The\s+parameter\s*(.+?)\s*has\s+already\s+been\s+reduced\.",
                        "deepspeed/runtime/zero/stage_1_and_2.py", 900, "reduce_ready_partitions_and_remove_grads", "", ())
    (tmp_path / ERRORS_FILE).write_text(json.dumps({"deepspeed": "0.17.1", "messages": 1, "with_pattern": 1}) + "\n"
                                        + json.dumps(asdict(entry)) + "\n", encoding="utf-8")
    script = ("import sys, json; from pathlib import Path; from app.doctor import diagnose_with; "
              f"d = diagnose_with(Path({str(tmp_path)!r}), None, 'deepspeed 0.19.8\\nAssertionError: The parameter 12 has already been reduced.', None); "
              "print(json.dumps([d.causes[0].source_url, d.causes[0].explanation, 'deepspeed' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    url, explanation, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert url.startswith("https://github.com/deepspeedai/DeepSpeed/blob/v0.17.1/deepspeed/runtime/zero/stage_1_and_2.py#L900")
    assert "(deepspeed 0.17.1)" in explanation and "the catalogue from 0.17.1" in explanation
    assert imported is False


def test_the_batch_assertion_is_worked_out_on_the_log_s_own_figures() -> None:
    """"32 != 4 * 2 * 8": the fix says what the product is and which single value makes the three agree."""
    from app.doctor import batch_figures

    log = ("[rank0]: AssertionError: Check batch related parameters. train_batch_size is not equal to "
           "micro_batch_per_gpu * gradient_acc_step * world_size 32 != 4 * 2 * 8")
    fix = diagnose(log).causes[0].fix
    assert fix.startswith("On this log's figures, 4 (micro batch) x 2 (accumulation steps) x 8 (GPUs) = 64, not 32")
    assert "`train_batch_size` 64, or `gradient_accumulation_steps` 1, or `train_micro_batch_size_per_gpu` 2." in fix
    odd = batch_figures("train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 30 != 4 * 2 * 8")
    assert "`train_batch_size` 64." in odd and "gradient_accumulation_steps` " not in odd  # 30 is no multiple of 32 or 16
    assert "world size of 1 is what is wrong" in batch_figures(log.replace("* 8", "* 1"))
    assert batch_figures("AssertionError: something else 32 != 4 * 2 * 8") == ""


def test_causes_the_message_names_alike_are_told_apart_by_the_rest_of_the_log() -> None:
    """Two known causes hold the same message ("'NoneType' object has no attribute 'backward'"); the one
    whose other text the log shows too (the Trainer's `--auto_find_batch_size` flag) leads, and without
    that line the note's first such cause (an evaluation before training) does."""
    from corpus import NOTES_DIR
    from indexer.known_causes import read_known_causes

    known = read_known_causes(NOTES_DIR)
    error = "AttributeError: 'NoneType' object has no attribute 'backward'"
    flagged = diagnose(f"python run_clm.py --deepspeed ds.json --auto_find_batch_size True\n{error}\n", known=known)
    assert "auto_find_batch_size" in flagged.causes[0].title
    plain = diagnose(f"python run_clm.py --deepspeed ds.json\n{error}\n", known=known)
    assert "auto_find_batch_size" not in plain.causes[0].title and "auto_find_batch_size" in " ".join(c.title for c in plain.causes)


def test_mined_failures_keep_their_known_cause() -> None:
    """Failures mined from issue threads outside every labelled log set (`tests/data/mined_error_logs.jsonl`, each
    log trimmed from its thread; a known cause was written from each): each still gets the cause written for it
    first, from the notes alone (no index, no retrieval). A later section whose text also shows in one of these
    logs, or a change of the ordering, fails here by name."""
    import json
    from pathlib import Path

    from corpus import NOTES_DIR
    from indexer.known_causes import read_known_causes

    known = read_known_causes(NOTES_DIR)
    rows = [json.loads(line) for line in (Path(__file__).parent / "data" / "mined_error_logs.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 40 and len({r["id"] for r in rows}) == len(rows)
    wrong = [(r["id"], r["cause_title"], first.title) for r in rows
             if (first := diagnose(r["log"], known=known).causes[0]).title != r["cause_title"]]
    assert not wrong, wrong


def test_a_matches_text_with_a_hole_stands_for_any_one_word() -> None:
    """A `…` in a known cause's text matches one word of the log, and the cause names what the log shows there:
    every option line of a launch command whose continuation broke runs as a command of its own, whatever the
    option (bash and zsh word it differently, a Chinese locale in its own words), and outranks the cause that
    only shares the tail of one such line ("deepspeed: command not found": the launcher missing from PATH)."""
    from corpus import NOTES_DIR
    from indexer.known_causes import parse_known_causes, read_known_causes

    (parsed,) = parse_known_causes("## Broken continuation\nMatches: `--…: command not found`\nFix: f\n")
    assert parsed.found_in("run.sh: line 4: --num_gpus: command not found") == "--num_gpus: command not found"
    assert parsed.found_in("bash: deepspeed: command not found") == ""
    assert parsed.found_in("--a b: command not found") == ""  # one word, not a run of them
    known = read_known_causes(NOTES_DIR)
    for log in ("train.sh: line 5: --deepspeed: command not found",
                "zsh: command not found: --deepspeed_multinode_launcher",
                "--deepspeed_multinode_launcher: 未找到命令"):
        first = diagnose(log, known=known).causes[0]
        assert "line continuations are broken" in first.title and "--deepspeed" in first.explanation, (log, first.title)
    assert "launcher command is not found" in diagnose("bash: deepspeed: command not found", known=known).causes[0].title


def test_the_nearest_known_cause_is_looked_for_with_what_the_writer_said_around_the_error() -> None:
    """A message no known text or raising line explains is held against the known causes' passages together
    with the log's prose (a comment, the set-up, the command), never its frames or timestamped records: "not
    enough values to unpack" alone says nothing, beside "PipelineModule ... train_batch" it is a batch's shape."""
    from app.error_log import prose_lines

    log = ("# PipelineModule trained with engine.train_batch(data_iter=loader); the collate function returns 4 tensors\n"
           "[2024-01-02 10:00:00,000] [INFO] [engine.py:1] starting\n"
           "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    loss = engine.train_batch()\n"
           "ValueError: not enough values to unpack (expected 4, got 1)\n")
    context = prose_lines(log)
    assert context.startswith("PipelineModule trained with engine.train_batch") and "[INFO]" not in context and "line 9" not in context
    asked: list[str] = []
    diagnose(log, closest_known=lambda text: asked.append(text))
    assert asked and asked[0].startswith("PipelineModule trained") and asked[0].endswith("not enough values to unpack (expected 4, got 1)")


def test_a_known_cause_near_in_meaning_leads_over_a_close_text_and_a_release_s_bug() -> None:
    """For a log that shows no known text, the known cause nearest in meaning comes before one whose text the
    message nearly holds and before the guess that an older release had a bug; without a near one, those lead."""
    from corpus import NOTES_DIR
    from indexer.known_causes import read_known_causes

    known = read_known_causes(NOTES_DIR)
    close_text = "RuntimeError: weight tensor must be 2-D"
    close = diagnose(close_text, known=known).causes[0]
    close_title = close.title
    assert "the message is close to" in close.explanation
    near = next(k for k in known if k.title != close_title and not k.harmless)
    first = diagnose(close_text, known=known, closest_known=lambda text: (near, 0.7)).causes[0]
    assert close_title != near.title and first.title == near.title and "cosine 0.70" in first.explanation
    older = "deepspeed 0.5.9, torch 1.10.0\nRuntimeError: slice() cannot be applied to a 0-dim tensor xyz\n"
    assert "likely a bug of deepspeed 0.5.9" in diagnose(older, known=known, closest_known=lambda text: None).causes[0].title
    assert diagnose(older, known=known, closest_known=lambda text: (near, 0.7)).causes[0].title == near.title


def test_of_the_known_causes_near_in_meaning_the_one_whose_words_the_log_shares_leads() -> None:
    """Whether a known cause is near is told by the cosine alone (none below KNOWN_COSINE); which near one leads,
    by cosine and words together: a log naming the second-closest cause's tool gets that cause. A fake embedder
    (fixed vectors) stands in for the model here; the real one is measured by the quality suite's ablation."""
    from types import SimpleNamespace

    import numpy as np

    from app.known_cause_search import KNOWN_COSINE, KnownCauseWords, closest_known_cause
    from indexer.known_causes import parse_known_causes

    known = tuple(parse_known_causes(
        "## Port taken\nMatches: `EADDRINUSE`\nWhy: an earlier run holds the rendezvous port.\nFix: pass --master_port.\n"
        "## Op build fails\nMatches: `ninja: build stopped`\nWhy: the cpu_adam extension needs a compiler and ninja.\nFix: install ninja.\n"
        "## Hostfile\nMatches: `bad entry`\nWhy: a hostfile line lacks slots.\nFix: write host slots=N.\n"
        "## SSH\nMatches: `exit code 255`\nWhy: passwordless ssh is missing.\nFix: ssh-copy-id.\n"))
    assert KnownCauseWords(known).scores("cpu_adam ninja").argmax() == 1
    vectors = np.array([[0.9, np.sqrt(1 - 0.81)], [0.88, np.sqrt(1 - 0.88**2)], [0.2, np.sqrt(0.96)], [0.1, np.sqrt(0.99)]])
    query = np.array([1.0, 0.0])
    retriever = SimpleNamespace(index=SimpleNamespace(chunks=[SimpleNamespace(url=k.url) for k in known]), matrix=vectors,
                                embedder=SimpleNamespace(embed=lambda texts: np.array([query])))
    closest = closest_known_cause(retriever, known)
    assert closest is not None
    assert closest("RuntimeError: something failed")[0].title == "Port taken"  # type: ignore[index]
    cause, cosine = closest("RuntimeError: the cpu_adam build needs ninja")  # type: ignore[misc]
    assert cause.title == "Op build fails" and abs(cosine - 0.88) < 1e-6
    far = SimpleNamespace(index=retriever.index, matrix=vectors * [KNOWN_COSINE - 0.05, 1.0], embedder=retriever.embedder)
    assert closest_known_cause(far, known)("RuntimeError: the cpu_adam build needs ninja") is None  # type: ignore[misc]
