"""dsqa: the tiny training script the `deepspeed` launcher runs in place of a doc's script."""

import argparse
import json
import sys

import deepspeed
import exit_on_error  # noqa: F401  (its hook: an uncaught error ends the run at once)
import torch

# the run sits in main() behind the __main__ guard: a config whose optimizer starts a process with
# multiprocessing's spawn (ZenFlow's overlap_step) re-imports this file in the child, which must not
# run deepspeed.initialize again (it did: EADDRINUSE in the child, and the parent waited for it)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)
    args, _ = parser.parse_known_args()  # the doc's own script arguments are accepted and ignored
    with open("ds_config.json") as f:
        cfg = json.load(f)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for _ in range(3):
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 8, device=engine.device)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    sys.stdout.write("DSQA_RESULT " + json.dumps({"rank": rank, "world_size": world, "optimizer_steps": engine.global_steps}) + "\n")  # one write: ranks share stdout
    sys.stdout.flush()
    if torch.distributed.is_initialized():  # a group left to interpreter exit can crash gloo's threads (SIGABRT/SIGSEGV)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
