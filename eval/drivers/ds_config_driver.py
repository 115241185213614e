"""dsqa: run a DeepSpeed config for real (written into the sandbox by eval/programs.py).

A tiny MLP through deepspeed.initialize with ds_config.json, a few real steps (forward, backward,
step), and a checkpoint save and load when plan.json says the config touches checkpointing. A
tensor-parallel config runs in one process per rank (the launcher starts them) on a tiny Llama built
from its config (no download), whose layers the docs' AutoTP presets and patterns name.
"""

import json
import math
import os
import sys

import deepspeed
import exit_on_error  # noqa: F401  (its hook: an uncaught error ends the run at once)
import torch

# the run sits in main() behind the __main__ guard: a config whose optimizer starts a process with
# multiprocessing's spawn (ZenFlow's overlap_step) re-imports this file in the child, which must not
# run deepspeed.initialize again (it did: EADDRINUSE in the child, and the parent waited for it)


def main() -> None:
    with open("plan.json") as f:
        plan = json.load(f)
    with open("ds_config.json") as f:
        cfg = json.load(f)
    torch.manual_seed(0)
    D = 16
    ac = cfg.get("activation_checkpointing") if isinstance(cfg.get("activation_checkpointing"), dict) else None
    use_ac = bool(ac) and not ac.get("partition_activations")


    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = torch.nn.Linear(D, 32)
            self.act = torch.nn.GELU()
            self.l2 = torch.nn.Linear(32, D)

        def forward(self, x):
            h = self.act(self.l1(x))
            return deepspeed.checkpointing.checkpoint(self.l2, h) if use_ac else self.l2(h)


    def tiny_llama():
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=4))


    llama = plan.get("model") == "llama"
    if llama:
        use_ac = False
    model = tiny_llama() if llama else Tiny()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    if ac:
        deepspeed.checkpointing.configure(None, deepspeed_config=cfg)
    dtype = next(engine.module.parameters()).dtype
    micro = engine.train_micro_batch_size_per_gpu()
    device = engine.device


    def batch_loss():
        if llama:  # the same tokens on every rank of a tensor-parallel group
            ids = torch.randint(0, 64, (micro, 8), device=device)
            return engine(input_ids=ids, labels=ids).loss
        x = torch.randn(micro, D, device=device)
        return torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), x.flip(-1))


    losses = []
    for _ in range(plan["steps"]):
        loss = batch_loss()
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.item()))
    if not all(math.isfinite(v) for v in losses):
        raise SystemExit(f"non-finite loss: {losses}")
    if engine.global_steps < 1:
        raise SystemExit(f"no optimizer step in {plan['steps']} micro steps")
    result = {"micro_steps": len(losses), "optimizer_steps": engine.global_steps, "first_loss": losses[0],
              "last_loss": losses[-1], "dtype": str(dtype), "zero_stage": engine.zero_optimization_stage(),
              "activation_checkpointing": use_ac, "world_size": deepspeed.comm.get_world_size(), "model": "tiny llama" if llama else "tiny mlp"}
    if os.path.isdir("nvme_swap"):  # NVMe offload: the swap folders deepspeed made, and the files it wrote through libaio
        result["nvme_swap_files"] = sum(len(files) for _, _, files in os.walk("nvme_swap"))
    if llama:  # how many of q_proj's 32 output rows this rank holds: 8 when AutoTP split it four ways
        result["q_proj_rows"] = int(engine.module.model.layers[0].self_attn.q_proj.weight.shape[0])
    if plan.get("checkpoint"):
        engine.save_checkpoint("ckpt", tag="dsqa")
        universal = isinstance(cfg.get("checkpoint"), dict) and cfg["checkpoint"].get("load_universal")
        if universal:
            result["checkpoint"] = "saved (load_universal: loading needs a ds_to_universal conversion, not done)"
        else:
            path, client = engine.load_checkpoint("ckpt", tag="dsqa")
            if path is None:
                raise SystemExit("load_checkpoint found nothing to load")
            loss = batch_loss()
            engine.backward(loss)
            engine.step()
            result["checkpoint"] = "saved and loaded, then one more step"
    if plan.get("save_16bit"):
        engine.save_16bit_model("ckpt16")
        result["save_16bit_model"] = True
    sys.stdout.write("DSQA_RESULT " + json.dumps(result) + "\n")  # one write: the ranks of a run share stdout
    sys.stdout.flush()
    if torch.distributed.is_initialized():  # a group left to interpreter exit can crash gloo's threads (SIGABRT/SIGSEGV)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
