"""dsqa: run snippet.py as __main__ with the prelude's names that it uses without defining."""

import json
import runpy
import sys

import exit_on_error  # noqa: F401  (its hook: an uncaught error ends the run at once)

sys.path.insert(0, ".")
with open("plan.json") as f:
    plan = json.load(f)
init = {}
if plan["names"]:
    import prelude

    init = prelude.provide(plan["names"], **{k: v for k, v in plan.items() if k not in ("names", "stand_ins")})
if plan.get("stand_ins"):  # tiny local models for the Hub ids the snippet names (it has no network)
    import hub_stand_in

    for path, family in plan["stand_ins"].items():
        hub_stand_in.build(path, family)
sys.argv = ["snippet.py"]
runpy.run_path("snippet.py", init_globals=init, run_name="__main__")
import torch  # noqa: E402

if torch.distributed.is_initialized():  # a group left to interpreter exit can crash gloo's threads (SIGABRT/SIGSEGV)
    torch.distributed.destroy_process_group()
