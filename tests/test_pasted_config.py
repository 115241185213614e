"""A DeepSpeed config pasted into a question: found in the text, checked by the real validator (the
installed deepspeed's parser behind it), and said in the answer's first lines."""

from __future__ import annotations

import pytest

from app.pasted_config import PastedConfig, config_check_line, pasted_config, world_size_said

TOPS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization", "fp16", "bf16",
        "optimizer", "scheduler", "gradient_clipping"}


def test_a_whole_config_is_found_in_json_or_as_a_python_dict() -> None:
    text = 'Is this right? {"train_batch_size": 32, "zero_optimization": {"stage": 3}} thanks'
    assert pasted_config(text, TOPS) == PastedConfig({"train_batch_size": 32, "zero_optimization": {"stage": 3}}, True)
    alone = "engine.hot_update_config({\"optimizer\": {\"params\": {\"lr\": 1e-5}}}) online?"
    assert pasted_config(alone, TOPS) == PastedConfig({"optimizer": {"params": {"lr": 1e-5}}}, False)  # one key: a block
    python = "8卡训练，这个配置对吗 {'train_batch_size': 64, 'bf16': {'enabled': True}}"
    assert pasted_config(python, TOPS) == PastedConfig({"train_batch_size": 64, "bf16": {"enabled": True}}, True)
    trailing = 'is this right {"zero_optimization": {"stage": 2,}, "bf16": {"enabled": "auto"},}'
    assert pasted_config(trailing, TOPS) == PastedConfig({"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}, True)


def test_a_block_written_after_its_key_is_checked_as_that_block_alone() -> None:
    text = 'with "bf16": {"enabled": true} it crashes on TITAN X'
    assert pasted_config(text, TOPS) == PastedConfig({"bf16": {"enabled": True}}, False)
    inner = 'my zero block is "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}} - ok?'
    assert pasted_config(inner, TOPS) == PastedConfig({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, False)


@pytest.mark.parametrize("text", [
    "no config here at all",
    'tensor_parallel={"tp_size": 2} in init_inference',  # an argument, not a config block
    '{"lr": 1e-5, "eps": 1e-8}',  # no config key among its keys
    "a broken one {\"train_batch_size\": 32, ",
    "set {x for x in range(3)} somewhere",
    '{"a":' * 900 + "1" + "}" * 900,  # deeper than json's parser goes: RecursionError, once a 500
    "{" * 2000,
    '{"lr": ' + "[" * 1200 + "]" * 1200 + "}",
])
def test_text_without_a_config_has_none(text: str) -> None:
    assert pasted_config(text, TOPS) is None


def test_the_gpu_count_a_question_names() -> None:
    assert world_size_said("training on 8 GPUs with this") == 8
    assert world_size_said("8卡训练") == 8
    assert world_size_said("deepspeed --num_gpus 4 train.py") == 4
    assert world_size_said("torchrun --nproc_per_node=2 x.py") == 2
    assert world_size_said("a 7B model, batch 32") is None


def test_the_validators_findings_lead_with_what_to_change() -> None:
    config = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
              "fp16": {"enabled": True}, "bf16": {"enabled": True}}
    said = config_check_line(PastedConfig(config, True), "Is this config right?", "0.19.8")
    head, *lines = said.strip().split("\n")
    assert head == "Your config, checked by deepspeed 0.19.8's config parser and dsqa's checks: 1 problem."
    assert lines[0].startswith("- `bf16.enabled`: fp16 and bf16 are both enabled")
    # no GPU count said: 32 = 4 x 2 x 4 holds on 4 GPUs only, which is said rather than called wrong
    assert lines[1].startswith("- `train_batch_size`: 32 = micro batch 4 x accumulation 2 x 4 GPUs")
    on_eight = config_check_line(PastedConfig(config, True), "on 8 GPUs, is this right?", "0.19.8")
    assert "train_batch_size 32 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world size 8 = 64" in on_eight
    odd = config_check_line(PastedConfig({**config, "train_batch_size": 30, "bf16": {"enabled": False}}, True), "right?", "0.19.8")
    assert "is not train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x any number of GPUs" in odd


def test_a_misspelt_key_and_an_ignored_offload_are_named() -> None:
    said = config_check_line(PastedConfig({"zero_optimization": {"stage": 3, "overlap_comms": True}}, True), "?", "0.19.8")
    assert "- `zero_optimization.overlap_comms`: unknown key 'overlap_comms'" in said and "did you mean 'overlap_comm'?" in said
    assert ".?" not in said
    warned = config_check_line(PastedConfig({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, False), "?", "")
    assert warned.startswith("Your `zero_optimization` block, checked by the installed deepspeed's config parser")
    assert "offload_param is ignored at ZeRO stage 2" in warned and "(a warning: deepspeed runs, ignoring it)." in warned


def test_a_passing_config_says_what_was_checked_and_a_passing_block_says_nothing() -> None:
    whole = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}
    said = config_check_line(PastedConfig(whole, True), "is this right", "0.19.8")
    assert said.startswith("Your config passes deepspeed 0.19.8's config parser and dsqa's checks (unknown keys, types")
    assert config_check_line(PastedConfig({"bf16": {"enabled": True}}, False), "crashes on TITAN X", "0.19.8") == ""


def test_a_validator_failure_leaves_the_answer_to_the_docs() -> None:
    def broken(config: object, world_size: int) -> object:
        raise RuntimeError("boom")

    assert config_check_line(PastedConfig({"train_batch_size": 1}, True), "?", "0.19.8", broken) == ""  # type: ignore[arg-type]
