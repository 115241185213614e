"""dsqa's prelude for doc fragments: the names they assume, built only when a snippet uses them
without defining them (eval/programs.py finds those names with ast).

model / net: a tiny MLP (16 -> 32 -> 16), or its layers as a one-stage PipelineModule (`pipeline_model`) when
the fragment calls the pipeline engine's train_batch / eval_batch; calling it with (x, y) or a batch tuple returns the MSE loss; called
Hugging Face style, model(input_ids=..., labels=...), it returns an output with .loss and .logits (`HfOutput`), and a
fragment that calls model(**batch) gets its batches as dicts of input_ids and labels, and one that cuts its batch with
batch.split / batch.chunk gets each batch as one tensor (inputs and targets side by side), which the model answers with the loss.
optimizer: torch AdamW over model's parameters. engine / model_engine / ds_engine: deepspeed.initialize
of that model with `ds_config` (ZeRO stage 0, or the stage the plan asks for when the fragment calls what only a
ZeRO optimizer has). ds_config / config: {"train_micro_batch_size_per_gpu": 2, torch AdamW}
(no optimizer block when the snippet passes its own optimizer=; for init_inference {} on a GPU, {"dtype": float32} on a CPU). args / cmd_args: argparse.Namespace
with local_rank=0, deepspeed=True, deepspeed_config=<path of ds_config.json>, and 2 for each attribute the
fragment reads as a count (`range(args.steps)`). data_loader and friends:
a list of 4 (x, y) batches of 2; dataset: a TensorDataset of 8. batch / inputs / labels / x / y: one
batch. loss: the model's loss on that batch. criterion / loss_fn: MSELoss. device: the engine's
device. local_rank / rank: 0; world_size: 1. save_dir, ckpt_dir, checkpoint_dir, load_dir: "checkpoints";
ckpt_id / tag: "step0"; client_sd / client_state: {}; a fragment that reads a ZeRO checkpoint back (zero_to_fp32) and saves
none finds a real one there (`save_zero_checkpoint`). step / epoch: 0. mpu: None, or deepspeed's PipelineParallelGrid
over the one process when the fragment calls its methods (`one_process_grid`). self / module: the
tiny model (a method-body excerpt sets its attributes on it). parser: an ArgumentParser;
get_argument_parser (a tutorial script's own parser factory): ArgumentParser.
micro_batch_size: 2; sequence_parallel_size: 1; trainset: the dataset; cifar_trainset: a function returning it; dtype: float32; data_iter: an
iterator over the batches; tensor: one input; chunk_size: 2; output_dir / output_file: "out" /
"out/result.txt". Model / MyLargeModel / Net: the tiny model's class; weight_shape: (16, 16);
num_features: 16. optimizer_grouped_parameters / optimizer_parameters / param_groups / grouped_parameters:
one parameter group of model's parameters (weight_decay 0). Modules: torch, deepspeed, nn, F, np, os, sys, json, math, time, random, argparse,
dist (deepspeed.comm), get_accelerator.
"""

import argparse
import importlib
import json
import os

import torch

D = 16
_MODULES = {"torch": "torch", "deepspeed": "deepspeed", "nn": "torch.nn", "F": "torch.nn.functional", "np": "numpy",
            "os": "os", "sys": "sys", "json": "json", "math": "math", "time": "time", "argparse": "argparse",
            "dist": "deepspeed.comm", "random": "random"}


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(D, 32), torch.nn.ReLU(), torch.nn.Linear(32, D))
        self.paired = False  # True when the prelude's batches are tensors of inputs and targets side by side

    def forward(self, x=None, y=None, *rest, input_ids=None, labels=None, **kwargs):
        if x is None and input_ids is not None:  # a Hugging Face style call, model(**batch): an output with .loss and .logits
            logits = self.forward(input_ids)
            return HfOutput(torch.nn.functional.mse_loss(logits.float(), labels.float()) if labels is not None else None, logits)
        if isinstance(x, list | tuple):
            x, y = x[0], (x[1] if len(x) > 1 else None)
        if isinstance(x, dict):
            x, y = x.get("input_ids", next(iter(x.values()))), x.get("labels")
        if y is None and self.paired and isinstance(x, torch.Tensor) and x.shape[-1] == 2 * D:  # inputs and targets side by side
            x, y = x[..., :D], x[..., D:]
        dtype = next(self.parameters()).dtype
        out = self.net(x.to(dtype))
        return torch.nn.functional.mse_loss(out.float(), y.float()) if y is not None else out


class HfOutput:
    """What a Hugging Face model returns to model(**batch): the loss (when labels came) and the logits."""

    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits

    def __getitem__(self, i):
        return (self.loss, self.logits)[i] if self.loss is not None else (self.logits,)[i]


def save_zero_checkpoint(device, folder="checkpoints", tag="step0"):
    """A real ZeRO stage 2 checkpoint, as a page's earlier training step leaves it: a tiny model built as `model`
    is (same seed, same class, so the same parameter names), one optimizer step, `save_checkpoint` (its `latest`
    file and zero_to_fp32.py beside)."""
    import deepspeed

    torch.manual_seed(0)
    model = TinyModel().to(device)
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    loss = engine(torch.randn(2, D, device=device), torch.randn(2, D, device=device))
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(folder, tag=tag)


def pipeline_model():
    """The tiny model's layers as a one-stage PipelineModule with an MSE loss (distributed started first: the
    module reads the world size)."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    deepspeed.init_distributed()
    return PipelineModule(layers=list(TinyModel().net), num_stages=1, loss_fn=torch.nn.MSELoss())


def one_process_grid():
    """deepspeed's own model-parallel unit over one process: the mpu interface (get_model_parallel_rank,
    get_data_parallel_group...) that Megatron passes to deepspeed.initialize."""
    import deepspeed
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

    deepspeed.init_distributed()
    return PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=1, num_mp=1, num_dp=1))


def provide(names, client_optimizer=False, device="cpu", inference=False, config_in_call=False, saved_checkpoint=False, zero_stage=0,
            hf_batches=False, pipeline=False, arg_counts=(), mpu_grid=False, tensor_batches=False):
    names = set(names)
    dev = torch.device("cuda" if device == "cuda" and torch.cuda.is_available() else "cpu")
    g = {}
    for n in names & set(_MODULES):
        g[n] = importlib.import_module(_MODULES[n])
    if "get_accelerator" in names:
        from deepspeed.accelerator import get_accelerator

        g["get_accelerator"] = get_accelerator
    torch.manual_seed(0)
    model = pipeline_model().to(dev) if pipeline else TinyModel().to(dev)
    model.paired = tensor_batches
    cfg = {"train_micro_batch_size_per_gpu": 2}
    if zero_stage:  # a fragment calling what only a ZeRO optimizer has (offload_states, the scale of a manual backward)
        cfg["zero_optimization"] = {"stage": zero_stage}
        cfg["zero_allow_untested_optimizer"] = True  # a fragment passing its own torch optimizer
    if not client_optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}
    with open("ds_config.json", "w") as f:
        json.dump(cfg, f)
    batches = [(torch.randn(2, D, device=dev), torch.randn(2, D, device=dev)) for _ in range(4)]
    first = batches[0]  # (inputs, targets) of one batch, whatever shape the fragment's batches take
    if hf_batches:  # a fragment calling model(**batch): its page's batches are a tokenizer's dicts
        batches = [{"input_ids": x, "labels": y} for x, y in batches]
    if tensor_batches:  # a fragment cutting its batch into micro-batches (batch.split): one tensor per batch
        batches = [torch.cat([x, y], dim=-1) for x, y in batches]
    # init_inference's own default dtype is fp16, which a CPU does not run: the CPU prelude asks for fp32
    infer_cfg = {} if dev.type == "cuda" else {"dtype": torch.float32}
    simple = {
        "model": model, "net": model, "ds_config": infer_cfg if inference else cfg, "config": infer_cfg if inference else cfg, "ds_config_path": "ds_config.json",
        "config_path": "ds_config.json", "batch": batches[0], "inputs": first[0], "labels": first[1],
        "x": first[0], "y": first[1], "criterion": torch.nn.MSELoss(), "loss_fn": torch.nn.MSELoss(),
        "local_rank": 0, "rank": 0, "world_size": 1, "save_dir": "checkpoints", "ckpt_dir": "checkpoints",
        "checkpoint_dir": "checkpoints", "load_dir": "checkpoints", "ckpt_id": "step0", "tag": "step0",
        "client_sd": {}, "client_state": {}, "step": 0, "epoch": 0, "mpu": one_process_grid() if mpu_grid else None,
        "parameters": model.parameters(), "model_parameters": model.parameters(), "params": model.parameters(),
        "self": model, "module": model, "parser": argparse.ArgumentParser(), "get_argument_parser": argparse.ArgumentParser, "micro_batch_size": 2,
        "sequence_parallel_size": 1, "dtype": torch.float32, "data_iter": iter(batches), "tensor": first[0],
        "chunk_size": 2, "output_dir": "out", "output_file": "out/result.txt",
        "Model": TinyModel, "MyLargeModel": TinyModel, "Net": TinyModel, "weight_shape": (D, D), "num_features": D,
    }
    for n in ("optimizer_grouped_parameters", "optimizer_parameters", "param_groups", "grouped_parameters"):
        simple[n] = [{"params": list(model.parameters()), "weight_decay": 0.0}]
    for n in ("data_loader", "dataloader", "train_loader", "trainloader", "train_dataloader"):
        simple[n] = batches
    os.makedirs("out", exist_ok=True)
    for n in ("dataset", "train_dataset", "training_data", "trainset"):
        simple[n] = torch.utils.data.TensorDataset(torch.randn(8, D), torch.randn(8, D))
    simple["cifar_trainset"] = lambda *a, **k: simple["trainset"]  # the pipeline page's own loader function
    # deepspeed.initialize refuses a config both in args and in the call: a snippet passing config= gets args without one
    args = argparse.Namespace(local_rank=0, deepspeed=True, deepspeed_config=None if config_in_call else "ds_config.json", deepscale=False,
                              deepscale_config=None, deepspeed_mpi=False, **{n: 2 for n in arg_counts})
    simple["args"] = simple["cmd_args"] = args
    for n in names & set(simple):
        g[n] = simple[n]
    if names & {"optimizer", "engine", "model_engine", "ds_engine", "lr_scheduler", "scheduler", "device", "loss"}:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if "optimizer" in names:
            g["optimizer"] = optimizer
        if names & {"engine", "model_engine", "ds_engine", "device"} or ("scheduler" in names or "lr_scheduler" in names):
            import deepspeed

            kwargs = {} if "optimizer" in cfg else {"optimizer": optimizer}
            engine, _, _, sched = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg, **kwargs)
            for n in ("engine", "model_engine", "ds_engine"):
                if n in names:
                    g[n] = engine
            if "device" in names:
                g["device"] = engine.device
            for n in ("lr_scheduler", "scheduler"):
                if n in names:
                    g[n] = sched
        if "loss" in names:
            g["loss"] = model(*first)
    os.makedirs("checkpoints", exist_ok=True)
    if saved_checkpoint:  # a fragment reading back what an earlier step of its page saved
        save_zero_checkpoint(dev)
    return g
