"""The planner: for a stage on a target, the fewest chips that fit, the fastest layout at the chip
count, and what the run costs in hours, dollars and energy, with the error band the published anchor
runs give; or a clear reason it cannot run. Comparisons across targets and model summaries."""
from __future__ import annotations

from dataclasses import replace

from forge.errors import ForgeError
from forge.plan.anchors import band_for
from forge.plan.flops import training_flops_per_token
from forge.plan.hardware import get_system, load_catalog
from forge.plan.model import ModelSpec, count_parameters
from forge.plan.stage_plan import Goal, Setup, StagePlan, as_spec, infeasible_plan, plan_unbanded
from forge.plan.workloads import Workload

__all__ = ["Goal", "Setup", "StagePlan", "compare", "model_summary", "plan_stage", "total_training_flops"]


def plan_stage(
    model: dict | ModelSpec, workload: Workload, target: str = "local", goal: Goal = Goal(),
    setup: Setup = Setup(), catalog: dict | None = None, band: bool = True,
) -> StagePlan:
    """Plan `workload` for `model` (config dict or ModelSpec) on `target`.

    goal: plan at exactly goal.chips; else meet goal.deadline_h / goal.budget_usd if given; else the
    target's default size (one UltraServer, one node), raised to the fewest chips that fit.
    setup: the training stack (stacks.yaml; default: the target's), layout dimensions to pin
    (tp, cp, pp, vp, dp, zero, recompute, micro_batch) as a published run states them, an mfu
    override, flash attention. band: attach the error band derived from the anchors (anchors.py).
    """
    catalog = catalog if catalog is not None else load_catalog()
    plan = plan_unbanded(model, workload, target, goal, setup, catalog)
    if band:
        plan.error_band, plan.band_basis = band_for(plan.stack, get_system(target, catalog), plan.chips)
    return plan


def compare(model: dict | ModelSpec, workload: Workload, targets: list[tuple[str, int | None]],
            goal: Goal = Goal(), setup: Setup = Setup(), catalog: dict | None = None, band: bool = True,
            ) -> list[StagePlan]:
    """The same stage on several (target, chips) pairs, side by side (each pair's chips stand for
    goal.chips). A target that cannot run the workload at all (e.g. a precision its chip lacks) is
    marked infeasible; the rest are planned. An unknown target name is still an error: it is a
    typo, not a finding."""
    catalog = catalog if catalog is not None else load_catalog()
    plans = []
    for t, c in targets:
        system = get_system(t, catalog)
        try:
            plans.append(plan_stage(model, workload, t, replace(goal, chips=c), setup, catalog, band))
        except ForgeError as exc:
            plans.append(infeasible_plan(model, workload, system, c, str(exc)))
    return plans


def total_training_flops(model: dict | ModelSpec, tokens: float, seq_len: int) -> float:
    """Model FLOPs to train `tokens` tokens at `seq_len` (causal attention, logits included)."""
    return training_flops_per_token(as_spec(model), seq_len) * tokens


def model_summary(model: dict | ModelSpec) -> dict:
    """Exact parameter counts (total, active per token, embedding) and the bytes of the weights
    and of full mixed-precision training states (ZeRO paper's 16 B/param) per precision."""
    from forge.plan.memory import STATE_BYTES

    spec = as_spec(model)
    pc = count_parameters(spec)
    # weights stored at the precision itself (serving, frozen copies); training keeps 16-bit weights
    # and fp32 Adam states whatever the matmul precision (ZeRO paper, Sec. 3.1)
    stored = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "mxfp8": 1, "fp4": 0.5, "bf16-pure": 2}
    memory = {prec: {"weights_gb": pc.total * stored[prec] / 1e9, "training_states_gb": pc.total * (w + g + o) / 1e9}
              for prec, (w, g, o) in STATE_BYTES.items()}
    return {"name": spec.name, "arch": spec.arch, "params_total": pc.total, "params_active": pc.active,
            "params_embedding": pc.embedding, "params_lm_head": pc.lm_head, "layers": spec.layers,
            "hidden": spec.hidden, "memory": memory}
