"""Question forms (`app/query.py`): which questions ask nothing but what a config key is."""

from __future__ import annotations

import pytest

from app.query import (
    TERSE,
    api_names_in,
    asked_what_arguments,
    asked_what_returns,
    asks_first_release,
    asks_only_what_key_is,
    asks_other_library,
    asks_plan_or_figure,
    asks_what_argument_is,
    coverage_group,
    is_keyword_query,
    titles_in,
)

KEY = ["zero_optimization.overlap_comm"]


@pytest.mark.parametrize("question", [
    "What does overlap_comm do?",
    "what is zero_optimization.overlap_comm",
    "What does `overlap_comm` mean in the DeepSpeed config?",
    "What is the default value of overlap_comm?",
    "Explain the overlap_comm option please",
    "overlap_comm 是什么意思？",
    "zero_optimization 里的 overlap_comm 参数是干什么的",
    "zero3 的 overlap_comm 是干什么的？",  # the stage it is set for is no further question
    "ZeRO-3 中 overlap_comm 是什么意思？",
    "What does overlap_comm do in ZeRO stage 2?",
    "ZeRO-3 overlap_comm: what does it do?",
])
def test_defining_questions(question: str) -> None:
    assert asks_only_what_key_is(question, KEY)


@pytest.mark.parametrize("question", [
    "Is overlap_comm deprecated?",  # a status, not a definition
    "what does overlap_comm do on H100",  # hardware
    "When was overlap_comm added?",  # a version
    "Should I set overlap_comm to true with stage 3?",  # a choice and a value
    "What does overlap_comm do with 8 GPUs?",  # a setting of the user's
    "overlap_comm 开了以后 loss 会不会变",  # a symptom
    "When should I change overlap_comm?",  # advice on when
    "overlap_comm 应该设置多少？",  # a value to pick
    "What does overlap_comm do compared with contiguous_gradients?",  # a comparison with an unknown key
])
def test_questions_that_ask_more(question: str) -> None:
    assert not asks_only_what_key_is(question, KEY)


@pytest.mark.parametrize("question", [
    "What's the difference between overlap_comm and contiguous_gradients?",  # each key's entry answers its half
    "overlap_comm vs contiguous_gradients: how do they differ?",
    'What does "overlap_comm" buy me?',
    "How do I set overlap_comm and contiguous_gradients?",  # how to set them: each entry's section, type and default
    "overlap_comm 和 contiguous_gradients 怎么设置？",
    "overlap_comm 和 contiguous_gradients 有什么用？",
])
def test_two_keys_side_by_side_or_what_one_is_for(question: str) -> None:
    assert asks_only_what_key_is(question, KEY + ["zero_optimization.contiguous_gradients"])
    assert not asks_only_what_key_is(question.replace("overlap_comm", "overlap_comm on 8 GPUs"), KEY + ["zero_optimization.contiguous_gradients"])


def test_titles_named_as_a_phrase() -> None:
    titles = ["Domino", "ZeRO", "Mixed Precision ZeRO++"]
    assert titles_in("How do I enable Domino?", titles) == ["Domino"]
    assert titles_in("how does mixed precision zero++ work", titles) == ["Mixed Precision ZeRO++"]  # the longest name
    assert titles_in("What about DominoZ?", titles) == [] and titles_in("ZeRO-3 and zeros", titles) == ["ZeRO"]
    assert asks_only_what_key_is("How do I enable Domino?", ["Domino"])
    assert not asks_only_what_key_is("When was Domino released?", ["Domino"])


@pytest.mark.parametrize(("question", "keywords"), [
    ("hostfile format", True), ("zero3 offload config example", True), ("GatheredParameters example", True),
    ("How do I write a hostfile?", False), ("hostfile format?", False), ("my hostfile fails", False),
    ("hostfile 格式", False), ("what does a hostfile with slots and two nodes look like", False),
])
def test_keyword_queries(question: str, keywords: bool) -> None:
    assert is_keyword_query(question) is keywords


def test_no_key_named_is_never_defining() -> None:
    assert not asks_only_what_key_is("What does it do?", [])
    assert not asks_only_what_key_is("What does overlap_comm do?", ["zero_optimization.reduce_scatter"])


@pytest.mark.parametrize(("question", "asks"), [
    ("Which deepspeed version introduced the torch_autocast config block?", True),
    ("Since which release has deepspeed worked with numpy 2.x?", True),
    ("Which DeepSpeed release first shipped Domino?", True),
    ("Muon optimizer 是 deepspeed 哪个版本加进来的？", True),
    ("zero_to_fp32.py 的 --safe_serialization 参数是哪个版本开始有的？", True),
    ("Was the elasticity config block removed from DeepSpeed?", False),  # the installed version answers
    ("Which version of torch do I need for DeepSpeed 0.19?", False),
    ("What does overlap_comm do?", False),
])
def test_asks_first_release(question: str, asks: bool) -> None:
    assert asks_first_release(question) is asks


@pytest.mark.parametrize(("question", "asks"), [
    ("Is there any plan to support NVMe offload for the pipeline engine, and a rough timeframe?", True),
    ("What throughput should we expect for Llama-2-13B on 16 A100s with ZeRO-3?", True),
    ("How long does step 3 of DeepSpeed-Chat take for a 13B actor on one node?", True),
    ("Any published figure for Ulysses on MI250X?", True),
    ("In your experience, is ZeRO++ worth enabling on 4 nodes?", True),
    ("昇腾上的 DeepNVMe 有排期吗？", True),
    ("单卡 3090 用 ZeRO-Offload 训 1.3B 模型，每秒应该能跑多少 token？", True),
    ("大家实际用下来，ZeRO-3 和 FSDP 哪个坑更少？", True),
    ("Turning on offload roughly doubles my step time: which knob overlaps the copies?", False),
    ("What is the recommended way to save a ZeRO-3 checkpoint?", False),
    ("How many GPUs do I need for a 30B model with ZeRO-3 and CPU offload?", False),
    ("Where does the autotuner keep each experiment's config and measured throughput?", False),
    ("梯度累积是按 forward 次数算的，什么时候调用 step？", False),
])
def test_asks_plan_or_figure(question: str, asks: bool) -> None:
    assert asks_plan_or_figure(question) is asks


@pytest.mark.parametrize(("question", "asks"), [
    ("accelerate launch num_processes", True),
    ("How does bitsandbytes' 8-bit AdamW store the optimizer state?", True),
    ("vllm 怎么开张量并行", True),
    ("Does FSDP's HYBRID_SHARD keep a full replica per node?", True),
    ("How do I use DeepSpeed with accelerate and a DeepSpeedPlugin?", False),  # DeepSpeed named: about it
    ("FSDP vs ZeRO-3: which shards optimizer state?", False),
    ("add support for new accelerator", False),  # DeepSpeed's accelerator abstraction, not HF accelerate
    ("How do I convert a Megatron-LM checkpoint for inference?", False),  # the docs teach Megatron with DeepSpeed
    ("How do I log to wandb?", False),
])
def test_asks_other_library(question: str, asks: bool) -> None:
    assert asks_other_library(question) is asks


def test_settings_named_reads_config_keys_and_flags() -> None:
    from app.query import settings_named

    question = ('I set "stage3_prefetch_strategy": "adaptive" and "stage": 3, then ran deepspeed --num_gpus 2 '
                "--include localhost:0 with --gpu-type a100")
    # compound names only: "stage" and --include are ordinary words as well
    assert settings_named(question) == ["stage3_prefetch_strategy", "num_gpus", "gpu-type"]
    assert settings_named("how do I pick the number of GPUs?") == []
    # keyword arguments of a call: compound names only, never a comparison
    assert settings_named("deepspeed.init_inference(model, tp_size=2, dtype=torch.half, draft_model = d)") == ["tp_size", "draft_model"]
    assert settings_named("if (a, b_c == 3) or x_y=1") == []


def test_keyword_calls_read_each_calls_own_keywords() -> None:
    from app.query import keyword_calls

    assert keyword_calls("Does deepspeed.initialize(..., seed=1234) seed every rank?") == [("deepspeed.initialize", "seed")]
    assert keyword_calls("engine.save_checkpoint(d, tag=t, client_state=dict(step=3, lr=x))") == [
        ("engine.save_checkpoint", "tag"), ("engine.save_checkpoint", "client_state"),  # the nested call's are its own
        ("dict", "step"), ("dict", "lr")]
    assert keyword_calls("if (a == b) or f(x) and g(y, z==1)") == []
    assert keyword_calls("用 deepspeed.zero.Init(remote_device='cpu') 初始化") == [("deepspeed.zero.Init", "remote_device")]


def test_an_argument_no_function_of_that_name_takes_is_judged() -> None:
    from indexer.api_signatures import ApiSignatures, Signature

    table = ApiSignatures({
        "initialize": (Signature("deepspeed.initialize", ("args", "model", "config"), False),),
        "save_checkpoint": (Signature("deepspeed.runtime.engine.DeepSpeedEngine.save_checkpoint", ("save_dir", "tag"), False),),
        "init_inference": (Signature("deepspeed.init_inference", ("model", "config"), True),),
        "step": (Signature("deepspeed.runtime.engine.DeepSpeedEngine.step", ("lr_kwargs",), False),),
        "init_distributed": (Signature("deepspeed.init_distributed", ("dist_backend",), False),
                             Signature("deepspeed.comm.init_distributed", ("dist_backend", "rank"), False)),
    })
    assert table.unaccepted("deepspeed.initialize", "seed") is not None
    assert table.unaccepted("deepspeed.initialize", "config") is None
    assert table.unaccepted("engine.save_checkpoint", "tokenizer") is not None  # any receiver: a compound name is DeepSpeed's
    assert table.unaccepted("deepspeed.init_inference", "tp_size") is None  # it takes **kwargs
    assert table.unaccepted("model.step", "closure") is None  # `step` may be anybody's
    assert table.unaccepted("deepspeed.runtime.engine.DeepSpeedEngine.step", "closure") is not None
    assert table.unaccepted("init_distributed", "rank") is None  # one of the functions of that name takes it
    assert table.unaccepted("deepspeed.init_distributed", "rank") is not None  # the one written in full does not
    assert table.unaccepted("trainer.train", "resume_from_checkpoint") is None  # not a name the table has
    assert ApiSignatures().unaccepted("deepspeed.initialize", "seed") is None  # an index without the table


def test_signatures_are_read_from_the_installed_deepspeed() -> None:
    from indexer.package_source import api_signatures

    by_name = {s.qualified: s for s in api_signatures()}
    init = by_name["deepspeed.initialize"]
    assert {"model", "config", "model_parameters"} <= set(init.parameters) and "seed" not in init.parameters and not init.any_keyword
    save = by_name["deepspeed.runtime.engine.DeepSpeedEngine.save_checkpoint"]
    assert save.parameters[:2] == ("save_dir", "tag")  # a method's `self` is not an argument a caller passes
    assert by_name["deepspeed.init_inference"].any_keyword
    assert api_signatures({"deepspeed.no_such_function": None}) == []  # a symbol the installed deepspeed lacks
    # the defaults as a call writes them; a required parameter has none
    assert dict(save.defaults)["tag"] == "None" and "save_dir" not in dict(save.defaults)
    assert dict(by_name["deepspeed.init_inference"].defaults) == {"config": "None"}


def test_a_signature_table_keeps_its_defaults_and_shows_them_as_a_call_writes_them(tmp_path) -> None:
    """Defaults that are plain values read as Python writes them; an object ("<function checkpoint at 0x7f...>")
    or a long string only says the argument may be left out; a table written without defaults still reads."""
    import datetime
    import json

    from indexer.api_signatures import (
        ApiSignatures,
        Signature,
        call_form,
        default_text,
        signature_of,
        write_signatures,
    )

    def f(save_dir, tag=None, state={}, fn=print, timeout=datetime.timedelta(minutes=30), name="pytorch_model.bin",  # noqa: B006
          long="x" * 60, ratio=0.5, strict=True, **kwargs):
        """a stand-in with one default of each kind"""

    sig = signature_of(f, "deepspeed.f")
    assert sig is not None and sig.any_keyword
    assert call_form(sig) == ("`save_dir`, `tag=None`, `state={}`, `fn=...`, `timeout=...`, `name='pytorch_model.bin'`, "
                              "`long=...`, `ratio=0.5`, `strict=True`")
    assert default_text([1]) == "..." and default_text(()) == "()" and default_text(-1) == "-1"
    write_signatures(tmp_path / "s.json", [sig])
    assert ApiSignatures.read(tmp_path / "s.json").by_name["f"] == (sig,)
    (tmp_path / "old.json").write_text(json.dumps([{"qualified": "deepspeed.g", "parameters": ["a"], "any_keyword": False}]))
    assert call_form(ApiSignatures.read(tmp_path / "old.json").by_name["g"][0]) == "`a`"
    assert Signature("deepspeed.h", ("a", "b"), False, (("b", "1"),)).defaults == (("b", "1"),)


def test_a_signature_shows_short_types_by_their_own_names_and_enum_defaults_by_member(tmp_path) -> None:
    """A type reads as a reader writes it (no module path, None for NoneType), PEP 8's spacing once one is written;
    `Any` and a type too long for a line are left out; an enum default is its class and member, never its repr."""
    import datetime
    import enum
    from collections.abc import Callable
    from typing import Any

    from indexer.api_signatures import ApiSignatures, call_form, signature_of, write_signatures

    class Device(str, enum.Enum):  # noqa: UP042 (as deepspeed's OffloadDeviceEnum is written)
        cpu = "cpu"

    def f(model: datetime.timedelta, port: int = 29500, backend: str | None = None, device: Device = Device.cpu,
          anything: Any = None, long: Callable[[int, str, float], datetime.timedelta] | list[datetime.date] | None = None,
          plain=1):
        """a stand-in with one annotation of each kind"""

    sig = signature_of(f, "deepspeed.f")
    assert sig is not None
    assert call_form(sig) == ("`model: timedelta`, `port: int = 29500`, `backend: str | None = None`, "
                              "`device: Device = Device.cpu`, `anything=None`, `long=None`, `plain=1`")
    write_signatures(tmp_path / "s.json", [sig])
    assert ApiSignatures.read(tmp_path / "s.json").by_name["f"] == (sig,)


@pytest.mark.parametrize(("question", "asks"), [
    ("Was the elasticity config block removed from DeepSpeed?", True),
    ("Is zero_optimization.cpu_offload deprecated?", True),
    ("Is the sparse_attention block still supported?", True),
    ("zero_optimization 里的 cpu_offload 被废弃了吗？", True),
    ("When was cpu_offload removed?", False),  # when, or in which release: the status cannot say
    ("In which version did cpu_offload get deprecated?", False),
    ("cpu_offload 是哪个版本被移除的？", False),
    ("How do I replace the removed cpu_offload option?", False),  # not a yes-or-no question about it
])
def test_asks_whether_removed(question: str, asks: bool) -> None:
    from app.query import asks_whether_removed

    assert asks_whether_removed(question) is asks


@pytest.mark.parametrize(("question", "terse"), [
    ("bf16 or fp16?", True), ("how to resume from a zero3 checkpoint?", True),
    ("how do I resume training from a zero3 checkpoint?", False), ("zero3 怎么导出权重？", True),
    ("8 张 3090 做 zero3 offload 的时候为什么 CPU 内存会爆掉？", False), ("  ds_report  ", True),
])
def test_coverage_group(question: str, terse: bool) -> None:
    """At most 7 words, or 20 characters when the question holds Chinese: the terse group."""
    assert (coverage_group(question) == TERSE) is terse


LOAD = ["deepspeed.runtime.engine.DeepSpeedEngine.load_checkpoint"]


@pytest.mark.parametrize(("question", "asks"), [
    ("What does load_checkpoint return?", True),
    ("What does model_engine.load_checkpoint return?", True),  # the user's own name of the engine
    ("What is returned by DeepSpeedEngine.load_checkpoint?", True),
    ("load_checkpoint 返回什么？", True),
    ("engine.load_checkpoint 的返回值是什么", True),
    ("What does load_checkpoint do?", False),  # what it does: the symbol's summary answers
    ("Why does load_checkpoint return None on rank 1?", False),  # a symptom
    ("What does load_checkpoint return after a failed save?", False),  # a case of the user's
])
def test_questions_asking_only_what_a_function_returns(question: str, asks: bool) -> None:
    assert api_names_in(question, LOAD, after_any_object=True) == LOAD
    assert asked_what_returns(question, LOAD) == (LOAD if asks else [])


def test_a_method_is_named_after_the_users_own_object_only_when_asked_so() -> None:
    assert api_names_in("model_engine.load_checkpoint(path)", LOAD) == []  # an API page's symbol needs its own name
    assert api_names_in("model_engine.load_checkpoint(path)", LOAD, after_any_object=True) == LOAD
    assert api_names_in("my_load_checkpoint()", LOAD, after_any_object=True) == []  # a name that only ends alike
    engine_class = "deepspeed.runtime.engine.DeepSpeedEngine"  # a class named as the start of its method's name gives way
    assert api_names_in("DeepSpeedEngine.load_checkpoint", [engine_class, *LOAD]) == LOAD
    assert api_names_in("DeepSpeedEngine", [engine_class, *LOAD]) == [engine_class]


@pytest.mark.parametrize(("question", "argument", "asks"), [
    ("What does the tag argument of load_checkpoint do?", "tag", True),
    ("What is the `load_module_only` parameter of model_engine.load_checkpoint?", "load_module_only", True),
    ("load_checkpoint 的 tag 参数是什么？", "tag", True),
    ("What does tag=latest do in load_checkpoint?", "tag", False),  # no argument word: a value of the user's
    ("Why does the tag argument of load_checkpoint fail on rank 1?", "tag", False),  # a symptom
    ("What does the tag argument of load_checkpoint do after a universal conversion?", "tag", False),  # a case of the user's
])
def test_questions_asking_only_what_an_argument_is(question: str, argument: str, asks: bool) -> None:
    assert asks_what_argument_is(question, LOAD[0], argument) is asks


@pytest.mark.parametrize(("question", "asks"), [
    ("What arguments does load_checkpoint take?", True),
    ("Which parameters does model_engine.load_checkpoint accept?", True),
    ("load_checkpoint 有哪些参数？", True),
    ("What arguments does load_checkpoint take on a universal checkpoint?", False),  # a case of the user's
    ("Does load_checkpoint take a tag argument?", False),  # one argument, asked about by name
    ("What does load_checkpoint take?", False),  # no argument word: what it takes may be time, memory
])
def test_questions_asking_only_which_arguments_a_function_takes(question: str, asks: bool) -> None:
    assert asked_what_arguments(question, LOAD) == (LOAD if asks else [])
