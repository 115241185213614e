"""A planned ds_config run on this machine at tiny scale: the same config through the snippet runner
(a tiny model through `deepspeed.initialize` and a few real steps; world-size values adapted, fp16 as
bf16 on a CPU, each adaptation reported), so a plan says whether DeepSpeed accepted and ran it."""

from __future__ import annotations

import json
from typing import Any

from eval.runner import LocalRunner, RunRequest

PLAN_RUN_TIMEOUT_S = 600.0  # the first run with CPU offload compiles cpu_adam (~70 s on two cores)


def run_plan(config: dict[str, Any], runner: LocalRunner | None = None, timeout_s: float = PLAN_RUN_TIMEOUT_S) -> dict[str, Any]:
    """`status` (passed / failed / skipped / timeout / killed), `reason`, `adaptations`, `duration_s`,
    `device`: what the runner did with the config."""
    result = (runner or LocalRunner()).run(RunRequest(kind="ds_config", code=json.dumps(config, indent=2), timeout_s=timeout_s))
    return {"status": result.status, "reason": result.reason, "adaptations": list(result.adaptations),
            "duration_s": result.duration_s, "device": result.device}
