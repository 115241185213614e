"""The config planner: from a model size and the hardware to a ds_config that fits, with the memory
of every candidate, the choice, and the reasons (each with its docs link).

Model-state memory comes from DeepSpeed's own estimators (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`), byte for byte; activation memory is an estimate from the
standard transformer formula (stated in the reply); the rules are the table `RULES` below. The
emitted config is checked by `indexer/config_check.validate_config` for the planned world size.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from indexer.config_check import validate_config

GB = 1024**3
RESERVE = 0.10  # of GPU memory kept free (CUDA context, fragmentation, communication buffers)
AMPERE_OR_NEWER = ("a100", "a10", "a30", "a40", "a6000", "l4", "l40", "h100", "h200", "h800", "b100", "b200", "gh200", "rtx30", "rtx40", "mi250", "mi300")

# the decision rules, as data: (rule, the docs page that states it)
RULES = {
    "smallest_stage": ("Use the lowest ZeRO stage whose memory fits: each higher stage and every offload trades speed for memory.",
                       "https://www.deepspeed.ai/tutorials/zero/"),
    "offload_when_needed": ("Offload the optimizer (then the parameters) to CPU only when GPU memory does not suffice; NVMe when CPU memory does not either.",
                            "https://www.deepspeed.ai/tutorials/zero-offload/"),
    "stage3_params": ("Only ZeRO stage 3 partitions and offloads the parameters themselves.", "https://www.deepspeed.ai/docs/config-json/#zero-optimizations-for-fp16-training"),
    "bf16": ("bf16 on Ampere and newer GPUs (no loss scaling needed); fp16 with dynamic loss scaling on older ones.",
             "https://www.deepspeed.ai/docs/config-json/#bf16-training-options"),
    "batch": ("train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x the number of GPUs.",
              "https://www.deepspeed.ai/docs/config-json/#batch-size-related-parameters"),
    "checkpointing": ("Activation checkpointing keeps one layer's activations instead of all of them: use it before offloading for long sequences.",
                      "https://www.deepspeed.ai/docs/config-json/#activation-checkpointing"),
    "estimators": ("Model-state memory per GPU and per node from DeepSpeed's ZeRO memory estimators.",
                   "https://deepspeed.readthedocs.io/en/latest/memory.html"),
    "lora": ("With LoRA only the adapters train: their gradients and optimizer states are ZeRO's estimate for the trainable count; "
             "the frozen base weights are 16-bit, on every GPU below stage 3, partitioned (or offloaded) by stage 3.",
             "https://www.deepspeed.ai/tutorials/mixed_precision_zeropp/"),
}


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # hf_config before params: a missing count is an error only without a config.json to count from
    hf_config: dict[str, Any] | None = Field(default=None, description="A Hugging Face model's config.json: hidden size, layers, "
                                             "vocabulary and (without params) the parameter count come from it.")
    params: float | None = Field(default=None, gt=1e6, le=1e13, validate_default=True,
                                 description="Parameter count, e.g. 7e9 (or give hf_config).")
    gpus_per_node: int = Field(ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=4096)
    gpu_mem_gb: float = Field(gt=0, le=1024, description="Memory of one GPU in GB.")
    gpu_kind: str = Field(default="", max_length=32, description="e.g. a100, h100, v100 (decides bf16 or fp16).")
    cpu_mem_gb: float | None = Field(default=None, gt=0, le=65536, description="CPU memory of one node in GB.")
    nvme: str | None = Field(default=None, max_length=256, description="An NVMe path for ZeRO-Infinity offload.")
    seq_len: int = Field(default=2048, ge=16, le=1_048_576)
    micro_batch: int | None = Field(default=None, ge=1, le=4096)
    global_batch: int | None = Field(default=None, ge=1, le=10_000_000)
    hidden: int | None = Field(default=None, ge=64, le=65536)
    layers: int | None = Field(default=None, ge=1, le=1024)
    vocab: int = Field(default=32000, ge=100, le=1_000_000)
    lora_share: float | None = Field(default=None, gt=0, le=0.5,
                                     description="LoRA: the trainable share of the parameters, e.g. 0.01; none: full fine-tuning.")

    @field_validator("hf_config")
    @classmethod
    def _readable_config(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """A config.json whose sizes the planner can take: present, and within the bounds the same
        fields have when given directly."""
        if value is not None:
            shape = hf_shape(value)  # names what is missing
            for name, top in (("hidden", 65536), ("layers", 1024), ("vocab", 1_000_000), ("params", 1e13)):
                if shape[name] > top:
                    raise ValueError(f"its {name} ({shape[name]:.4g}) is above {top:g}")
        return value

    @field_validator("params")
    @classmethod
    def _count_or_config(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None and info.data.get("hf_config") is None:
            raise ValueError("give the parameter count (e.g. 7e9) or hf_config (a config.json)")
        return value

    @property
    def total(self) -> float:
        """The parameter count (set by now: given, or from hf_config)."""
        return float(self.params or 0)

    @model_validator(mode="after")
    def _shape(self) -> PlanRequest:
        """The model from its config.json when given: its sizes fill what was not given."""
        if self.hf_config is not None:
            shape = hf_shape(self.hf_config)
            self.hidden = self.hidden or shape["hidden"]
            self.layers = self.layers or shape["layers"]
            if "vocab_size" in self.hf_config:
                self.vocab = shape["vocab"]
            if self.params is None:
                self.params = float(shape["params"])
        return self

    @model_validator(mode="after")
    def _batches(self) -> PlanRequest:
        if self.micro_batch and self.global_batch and self.micro_batch * self.gpus_per_node * self.nodes > self.global_batch:
            raise ValueError("micro_batch x GPUs is larger than global_batch: lower micro_batch or raise global_batch")
        return self


@dataclass
class Candidate:
    stage: int
    offload_optimizer: str  # none | cpu | nvme
    offload_param: str
    per_gpu_gb: float  # model states + activations + reserve
    model_states_gpu_bytes: int  # DeepSpeed's estimator, as it returns it
    per_node_cpu_gb: float
    model_states_cpu_bytes: int
    fits: bool
    why_not: str = ""
    frozen_gpu_bytes: int = 0  # LoRA: the frozen 16-bit base weights on one GPU (2 bytes each; stage 3 partitions them)
    frozen_cpu_bytes: int = 0  # and in one node's CPU memory (stage 3 with parameter offload)


@dataclass
class Plan:
    choice: dict[str, Any]
    config: dict[str, Any]
    candidates: list[Candidate]
    reasons: list[dict[str, str]]
    validated: dict[str, Any]
    shape: dict[str, Any] = field(default_factory=dict)
    fits: bool = True

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "candidates": [asdict(c) for c in self.candidates]}


def _int(config: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def hf_shape(config: dict[str, Any]) -> dict[str, int]:
    """Hidden size, layers, vocabulary and parameter count of a decoder from its Hugging Face
    config.json (Llama/Mistral/Qwen names, GPT-2's and T5's too). Parameters: per layer the attention
    projections (grouped-query heads counted) and the MLP (three matrices for a gated activation such
    as SiLU, two otherwise), plus the embedding, twice when not tied; norms and biases left out."""
    hidden = _int(config, "hidden_size", "n_embd", "d_model")
    layers = _int(config, "num_hidden_layers", "n_layer", "num_layers")
    if hidden is None or layers is None:
        raise ValueError("no hidden_size / num_hidden_layers (or n_embd / n_layer) in it")
    vocab = _int(config, "vocab_size") or 32000
    heads = _int(config, "num_attention_heads", "n_head", "num_heads") or max(1, hidden // 128)
    kv_heads = _int(config, "num_key_value_heads") or heads
    head_dim = _int(config, "head_dim") or hidden // heads
    inner = _int(config, "intermediate_size", "n_inner", "d_ff") or 4 * hidden
    gated = str(config.get("hidden_act") or config.get("activation_function") or "").lower() in ("silu", "swiglu", "swish", "geglu")
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = (3 if gated else 2) * hidden * inner
    embedding = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    return {"hidden": hidden, "layers": layers, "vocab": vocab, "params": layers * (attention + mlp) + embedding}


def model_shape(req: PlanRequest) -> dict[str, Any]:
    """Hidden size and layers as given, or derived from the parameter count for a GPT-style shape
    (params = 12 x layers x hidden^2, hidden = 128 x layers), and the largest layer (the embedding)."""
    params = req.total
    if req.hidden and req.layers:
        hidden, layers, derived = req.hidden, req.layers, False
    else:
        hidden = req.hidden or int(round((128 * params / 12) ** (1 / 3) / 128) * 128) or 128
        layers = req.layers or max(1, round(params / (12 * hidden * hidden)))
        derived = True
    return {"hidden": hidden, "layers": layers, "largest_layer_params": req.vocab * hidden, "derived": derived}


def activation_bytes(req: PlanRequest, shape: dict[str, Any], micro: int, checkpointing: bool) -> int:
    """Per GPU, 16-bit: sbh(34 + 5as/h) per layer (Korthikanti et al.), heads a = hidden/128; with
    activation checkpointing only each layer's input (2sbh) is kept, plus one layer recomputed."""
    s, b, h, layers = req.seq_len, micro, shape["hidden"], shape["layers"]
    heads = max(1, h // 128)
    per_layer = s * b * h * (34 + 5 * heads * s / h)
    if checkpointing:
        return int(2 * s * b * h * layers + per_layer)
    return int(per_layer * layers)


Estimate = tuple[int, str, str, int, int, int, int]  # stage, offloads, estimator GPU/CPU bytes, frozen GPU/CPU bytes


def _estimates(req: PlanRequest, shape: dict[str, Any]) -> list[Estimate]:
    """Every candidate's model states from DeepSpeed's estimators, for the trainable parameters (all of
    them, or the LoRA share); with LoRA, the frozen 16-bit base weights beside them (2 bytes each: on
    every GPU at stage 2, a 1/world share at stage 3, in CPU memory with stage 3's parameter offload)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    gpn, n, largest = req.gpus_per_node, req.nodes, shape["largest_layer_params"]
    p = int(req.total * req.lora_share) if req.lora_share else int(req.total)
    frozen = 2 * (int(req.total) - p)  # bytes of 16-bit frozen weights (0 for full fine-tuning)
    world = gpn * n

    def zero2(offload: bool) -> Estimate:
        cpu, gpu = estimate_zero2_model_states_mem_needs(p, gpn, n, cpu_offload=offload)
        return (2, "cpu" if offload else "none", "none", int(gpu), int(cpu), frozen, 0)

    def zero3(opt: bool, par: bool) -> Estimate:
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(p, largest, gpn, n, cpu_offload=opt, cpu_offload_params=par)
        on_gpu, on_cpu = (0, frozen // n) if par else (frozen // world, 0)
        return (3, "cpu" if opt else "none", "cpu" if par else "none", int(gpu), int(cpu), on_gpu, on_cpu)

    # in the order the rules prefer: no offload at any stage first, then the optimizer, then the parameters
    out = [zero2(False), zero3(False, False), zero2(True), zero3(True, False), zero3(True, True)]
    if req.nvme:  # ZeRO-Infinity: the GPU side as with CPU offload, the states on NVMe, pinned buffers on the CPU
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(p, largest, gpn, n, cpu_offload=True, cpu_offload_params=True)
        out.append((3, "nvme", "nvme", int(gpu), int(4 * largest * gpn * 5), 0, 0))
    return out


def plan(req: PlanRequest) -> Plan:
    shape = model_shape(req)
    world = req.gpus_per_node * req.nodes
    micro = req.micro_batch or 1
    accumulation = max(1, math.ceil(req.global_batch / (micro * world))) if req.global_batch else 1
    long_sequence = req.seq_len >= 2048
    candidates: list[Candidate] = []
    for checkpointing in ((True,) if long_sequence else (False, True)):
        for stage, off_opt, off_par, gpu_bytes, cpu_bytes, frozen_gpu, frozen_cpu in _estimates(req, shape):
            act = activation_bytes(req, shape, micro, checkpointing)
            per_gpu = (gpu_bytes + frozen_gpu + act) / GB / (1 - RESERVE)
            per_cpu = (cpu_bytes + frozen_cpu) / GB
            why = []
            if per_gpu > req.gpu_mem_gb:
                why.append(f"needs {per_gpu:.1f} GB per GPU of {req.gpu_mem_gb:g}")
            if req.cpu_mem_gb is not None and per_cpu > req.cpu_mem_gb:
                why.append(f"needs {per_cpu:.1f} GB of CPU memory per node of {req.cpu_mem_gb:g}")
            candidates.append(Candidate(stage, off_opt, off_par, round(per_gpu, 2), gpu_bytes, round(per_cpu, 2), cpu_bytes, not why,
                                        "; ".join(why), frozen_gpu, frozen_cpu))
        if any(c.fits for c in candidates):
            break
    fitting = [c for c in candidates if c.fits]
    chosen = fitting[0] if fitting else min(candidates, key=lambda c: c.per_gpu_gb)
    bf16 = not req.gpu_kind or any(k in req.gpu_kind.lower().replace(" ", "") for k in AMPERE_OR_NEWER)
    config = _config(chosen, micro, accumulation, world, bf16, req.nvme)
    reasons = _reasons(req, chosen, bf16, long_sequence, shape, micro, accumulation, world, bool(fitting))
    result = validate_config(config, world_size=world)
    return Plan(
        choice={"stage": chosen.stage, "offload_optimizer": chosen.offload_optimizer, "offload_param": chosen.offload_param,
                "precision": "bf16" if bf16 else "fp16", "activation_checkpointing": long_sequence,
                "method": f"lora ({req.lora_share:g} trainable)" if req.lora_share else "full"},
        config=config, candidates=candidates, reasons=reasons, validated=result.to_json(), shape=shape, fits=bool(fitting),
    )


def _config(c: Candidate, micro: int, accumulation: int, world: int, bf16: bool, nvme: str | None) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": c.stage, "overlap_comm": True, "contiguous_gradients": True}
    for key, device in (("offload_optimizer", c.offload_optimizer), ("offload_param", c.offload_param)):
        if device != "none":
            zero[key] = {"device": device, "pin_memory": True, **({"nvme_path": nvme} if device == "nvme" else {})}
    if c.stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "train_batch_size": micro * accumulation * world,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
        "gradient_clipping": 1.0,
        ("bf16" if bf16 else "fp16"): {"enabled": True} if bf16 else {"enabled": True, "loss_scale": 0, "initial_scale_power": 16},
        "zero_optimization": zero,
    }


def _reasons(req: PlanRequest, c: Candidate, bf16: bool, long_sequence: bool, shape: dict[str, Any], micro: int,
             accumulation: int, world: int, fits: bool) -> list[dict[str, str]]:
    def say(rule: str, text: str) -> dict[str, str]:
        return {"text": text, "rule": RULES[rule][0], "url": RULES[rule][1]}

    trained = f" of the {req.total * req.lora_share:.3g} trainable parameters" if req.lora_share else ""
    reasons = [say("estimators", f"model states{trained}: {c.model_states_gpu_bytes / GB:.1f} GB per GPU, {c.model_states_cpu_bytes / GB:.1f} GB of CPU memory per node (DeepSpeed's estimator)")]
    if req.lora_share:
        reasons.append(say("lora", f"LoRA: the frozen base weights add {c.frozen_gpu_bytes / GB:.1f} GB per GPU and {c.frozen_cpu_bytes / GB:.1f} GB of CPU memory per node "
                                   f"(2 bytes x {req.total * (1 - req.lora_share):.3g} frozen parameters, an estimate by that formula)"))
    if fits:
        reasons.append(say("smallest_stage", f"ZeRO stage {c.stage} with optimizer offload {c.offload_optimizer} and parameter offload {c.offload_param} is the first candidate that fits in {req.gpu_mem_gb:g} GB per GPU ({c.per_gpu_gb:.1f} GB planned)"))
    else:
        reasons.append(say("offload_when_needed", f"nothing fits: the smallest per-GPU need is {c.per_gpu_gb:.1f} GB of {req.gpu_mem_gb:g}; add GPUs or nodes, lower micro_batch or seq_len{'' if req.nvme else ', or give an NVMe path'}"))
    if c.offload_param != "none":
        reasons.append(say("stage3_params", "the parameters themselves do not fit: stage 3 partitions and offloads them"))
    reasons.append(say("bf16", "bf16" + (" (the GPU kind is Ampere or newer)" if req.gpu_kind else " (no GPU kind given: assumed Ampere or newer; pass gpu_kind v100 for fp16)") if bf16 else "fp16 with dynamic loss scaling: the GPU kind predates bf16"))
    if long_sequence:
        reasons.append(say("checkpointing", f"sequence length {req.seq_len}: activation memory planned with checkpointing on (turn it on in the model, e.g. gradient_checkpointing_enable())"))
    reasons.append(say("batch", f"train_batch_size {micro * accumulation * world} = micro {micro} x accumulation {accumulation} x {world} GPUs"))
    if req.hf_config is not None:
        reasons.append({"text": f"from config.json: hidden {shape['hidden']}, {shape['layers']} layers, vocabulary {req.vocab}, "
                                f"{req.total:.3g} parameters (counted from the attention and MLP shapes when not given)", "rule": "", "url": ""})
    if shape["derived"]:
        reasons.append({"text": f"hidden {shape['hidden']} and {shape['layers']} layers were derived from the parameter count (GPT-style shape); give hidden and layers for a closer activation estimate", "rule": "", "url": ""})
    return reasons
