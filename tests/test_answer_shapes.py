"""Answer shapes by question type: the kind of a question, and what each kind adds (pure parts here;
each shape on the real index in tests/test_quality.py)."""

from __future__ import annotations

import numpy as np
import pytest

from app.answer import Candidate, Source
from app.answer_shapes import (
    ERROR_LINE,
    config_fragment,
    example_value,
    missing_sides,
    question_kind,
    returns_line,
    setting_line,
    sides,
    snippet_line,
    status_line,
)
from app.schemas import SnippetOut
from indexer.package_source import key_status
from indexer.text_units import Unit


@pytest.mark.parametrize(("question", "keys", "kind"), [
    ("Traceback (most recent call last):\n  ...\nRuntimeError: CUDA out of memory. What now?", [], "error"),
    ("I get ValueError: train_batch_size is not equal to micro_batch * gas * world_size", [], "error"),
    ("训练时报错，怎么解决？", [], "error"),
    ("sft.py: error: argument --deepspeed: invalid dict value: 'ds_z3.json'", [], "error"),  # argparse's, no exception class
    ("-bash: deepspeed: command not found", [], "error"),
    ("Was the elasticity block removed from DeepSpeed?", [], "version"),
    ("Is cpu_offload still supported or deprecated?", ["zero_optimization.cpu_offload"], "version"),
    ("Since which version does AutoTP training work?", [], "version"),
    ("stage3_gather_fp16_weights_on_model_save 这个参数还支持吗？", [], "version"),
    ("fp16 vs bf16 on A100: which should I use?", [], "compare"),
    ("What is the difference between ZeRO stage 2 and stage 3?", [], "compare"),
    ("ZeRO-2 和 ZeRO-3 的区别是什么？", [], "compare"),
    ("What does overlap_comm do?", ["zero_optimization.overlap_comm"], "config"),
    ("Which setting controls how often the loss scale is raised?", [], "config"),
    ("How do I launch on two nodes with a hostfile?", [], "howto"),
    ("怎么开启 ZeRO-3 的 offload？", [], "howto"),
    ("Tell me about pipeline parallelism.", [], "other"),
])
def test_question_kind(question: str, keys: list[str], kind: str) -> None:
    assert question_kind(question, keys) == kind


CATALOGUE = (
    "`elasticity` (type dict; default {}). Removed in deepspeed 0.19.8: Elastic training has been removed.\n"
    "`zero_optimization.cpu_offload` (type bool; default False). Deprecated: use `offload_optimizer` instead.\n"
    "`zero_optimization.overlap_comm` (type bool; default None). Attempts to overlap the reduction."
)


def test_key_status_reads_removed_and_deprecated_keys_only() -> None:
    status = key_status(CATALOGUE)
    assert status == {"elasticity": "removed in deepspeed 0.19.8: Elastic training has been removed.",
                      "zero_optimization.cpu_offload": "deprecated: use `offload_optimizer` instead"}


def test_status_line_for_named_keys_unless_already_said() -> None:
    status = key_status(CATALOGUE)
    line = status_line("was elasticity removed?", [], status)
    assert line == "`elasticity`: removed in deepspeed 0.19.8: Elastic training has been removed."
    assert status_line("is cpu_offload deprecated?", ["zero_optimization.cpu_offload"], status).endswith("instead.")
    assert status_line("was elasticity removed?", [], status, body="Elastic training has been removed. [1]") == ""
    assert status_line("is overlap_comm deprecated?", ["zero_optimization.overlap_comm"], status) == ""


def _cands(texts: list[str]) -> list[Candidate]:
    src = Source(1, "T", "H", " ".join(texts))
    return [Candidate(src, Unit(t, 0), i) for i, t in enumerate(texts)]


def test_a_comparison_gets_the_side_its_units_left_out() -> None:
    tests = sides("fp16 vs bf16: which one?")
    assert len(tests) == 2
    cands = _cands(["bf16 needs no loss scaling.", "Loss scaling keeps fp16 gradients from underflowing.", "Unrelated."])
    scores = np.array([0.9, 0.5, 0.1])
    extra = missing_sides("bf16 needs no loss scaling. [1]", cands, scores, tests)
    assert [c.unit.text for c in extra] == ["Loss scaling keeps fp16 gradients from underflowing."]
    assert missing_sides("bf16 and fp16 both [1]", cands, scores, tests) == []
    assert sides("What is overlap_comm?") == []  # one side: not a comparison
    assert len(sides("reduce_bucket_size versus allgather_bucket_size")) == 2  # identifiers when no option family


def _snippet(sid: str, status: str) -> SnippetOut:
    return SnippetOut(id=sid, language="json", kind="ds_config", code="{}", source_url="u", status=status, label=status)


def test_howto_example_is_a_snippet_that_ran_or_was_checked_in_the_first_passages() -> None:
    snippets = [_snippet("a", "fails"), _snippet("b", "checked"), _snippet("c", "ran"), _snippet("d", "ran")]
    assert snippet_line(snippets, {"a", "b", "c"}) == "Example: snippet `c` (ran; below)."
    assert snippet_line(snippets, {"a", "b"}) == "Example: snippet `b` (checked; below)."
    assert snippet_line(snippets, {"a"}) == ""  # failing code is never offered
    assert "dsqa doctor" in ERROR_LINE and "/diagnose" in ERROR_LINE


def test_a_question_that_asks_only_for_the_cause_or_fix_of_its_message() -> None:
    from app.pasted_error import asks_only_for_a_fix, little_but_message, pasted_log

    fix_only = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. How do I fix this?",
                "I get ModuleNotFoundError: No module named 'deepspeed' when I run my script, why?",
                "deepspeed: command not found, how to fix?", "RuntimeError: Error building extension 'cpu_adam'. Any idea?",
                "训练报 RuntimeError: Error building extension cpu_adam 怎么解决？"]
    assert all(asks_only_for_a_fix(q) for q in fix_only)
    more = ["torch.cuda.OutOfMemoryError: CUDA out of memory. Does DeepSpeed have guidance on memory fragmentation?",
            "Fine-tuning StarCoder with torchrun and a ZeRO-3 json, it dies with AssertionError: foo bar baz. What is wrong?",
            "What does overlap_comm do?", "ModuleNotFoundError: No module named 'deepspeed'"]
    assert not any(asks_only_for_a_fix(q) for q in more)
    log = "[INFO] [launch.py:256:main] process 4121 spawned\nRuntimeError: Error building extension 'cpu_adam'"
    assert pasted_log(log) and little_but_message(log)
    assert not pasted_log("my job died:\nRuntimeError: boom") and not pasted_log("RuntimeError: boom")


def test_a_question_asking_how_to_set_keys_gets_them_nested_in_the_config() -> None:
    facts = {"zero_optimization.overlap_comm": ("bool | None", "None"), "zero_optimization.offload_optimizer.pin_memory": ("bool", "True"),
             "zero_optimization.offload_param.pin_memory": ("bool", "True"), "autotuning.tuner_type": ("str", "'gridsearch'"),
             "autotuning.tuner_num_trials": ("int", "50"), "aio.block_size": ("int", "1,048,576"), "amp": ("dict", "{}")}
    assert example_value("bool", "False") is True and example_value("bool", "True") is False  # what setting it changes
    assert example_value("bool", "True", "how do I enable it") is True and example_value("bool", "None", "关闭它") is False
    assert example_value("int", "1,048,576") == 1048576 and example_value("float", "0.5") == 0.5
    assert example_value("str", "'gridsearch'") == "gridsearch"
    assert example_value("dict", "{}") is None and example_value("int", "sys.maxsize") is None and example_value("any", "None") is None
    assert config_fragment(["autotuning.tuner_type", "autotuning.tuner_num_trials", "amp"], facts) == {
        "autotuning": {"tuner_type": "gridsearch", "tuner_num_trials": 50}}
    assert (setting_line("How do I set overlap_comm?", ["zero_optimization.overlap_comm"], facts)
            == 'In the DeepSpeed config: `{"zero_optimization": {"overlap_comm": true}}`.')
    pins = ["zero_optimization.offload_optimizer.pin_memory", "zero_optimization.offload_param.pin_memory"]
    assert (setting_line("How to enable pin_memory for offload_optimizer?", pins, facts)  # the section the question names
            == 'In the DeepSpeed config: `{"zero_optimization": {"offload_optimizer": {"pin_memory": true}}}`.')
    assert setting_line("怎么设置 block_size", ["aio.block_size"], facts) == 'In the DeepSpeed config (its default shown): `{"aio": {"block_size": 1048576}}`.'
    assert setting_line("What does overlap_comm do?", ["zero_optimization.overlap_comm"], facts) == ""  # asks what, not how
    assert setting_line("How do I set amp?", ["amp"], facts) == ""  # nothing to show


def test_what_a_function_returns_is_read_from_its_docstring_else_its_signature() -> None:
    section = ("API `deepspeed.x.load` in deepspeed 0.19.8. Signature: `load(self, path, tag=None) -> Tuple[str, dict]`\n\n"
               "Load a checkpoint.\n\nArguments:\n    path: Required. Where it is.\n\nReturns:\n"
               "    A tuple of ``load_path`` and\n    ``client_state``.\n    *``load_path``: Path of the loaded checkpoint.\n\n"
               "* ``client_state``: State the client saved,\n  as a dict\n\nImportant: under ZeRO3, reload the engine first.\n")
    said = returns_line("deepspeed.x.load", section)
    assert said == ("`deepspeed.x.load` returns: A tuple of `load_path` and `client_state`. `load_path`: Path of the loaded "
                    "checkpoint. `client_state`: State the client saved, as a dict.")  # the items after it, not what follows them
    bare = section.split("Returns:")[0]
    assert returns_line("deepspeed.x.load", bare) == "`deepspeed.x.load` returns `Tuple[str, dict]` (its signature's annotation)."
    assert returns_line("deepspeed.x.load", "Load a checkpoint.") == ""
    assert returns_line("deepspeed.x.Loader", section) == ""  # a class: its constructor's `None` is no answer
    long = "Returns:\n    " + " ".join(["word"] * 50) + "\n\n* ``a``: " + " ".join(["more"] * 30) + "\n"
    assert returns_line("deepspeed.x.f", long).count("more") == 0  # whole items within the words
