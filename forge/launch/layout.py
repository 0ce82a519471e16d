"""The layout a launched job runs, taken from the plan: which stack forge runs on the target, how
many chips, nodes and processes, data-parallel degree and strategy, and the `forge run` command
every engine starts; refused (a one-line ForgeError) when no engine could run it as planned.

forge's training loop is data parallel (DDP, or FSDP2 where the recipe schema has it), so the plan
is made with tensor, pipeline and context parallelism pinned to 1: the launched layout is the
planned one, chip for chip.
"""
from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, field

from forge.errors import ForgeError
from forge.plan.hardware import System, get_system, parse_targets
from forge.plan.planner import Goal, Setup, StagePlan, compare
from forge.plan.search import chip_counts
from forge.plan.stacks import engine_data, launch_stack, load_stacks

STRATEGY_ZERO = {"ddp": 0, "fsdp": 3}
PORT = 29500


@functools.lru_cache(maxsize=1)
def schema_strategies() -> tuple[str, ...]:
    """The parallelism strategies the recipe schema accepts (forge.recipe.schema.Parallelism)."""
    from forge.recipe.schema import Parallelism

    return tuple(typing.get_args(Parallelism.model_fields["strategy"].annotation))


@dataclass(frozen=True)
class Launch:
    """A job: `nodes` nodes of `chips_per_node` chips, `ranks_per_chip` processes a chip, each
    running `forge run RECIPE OVERRIDES`; `plans` are the stage plans it was taken from."""

    recipe: str
    name: str
    target: str
    chip: str
    stack: str
    strategy: str
    chips: int
    nodes: int
    chips_per_node: int
    ranks_per_chip: int
    backend: str
    overrides: tuple[str, ...]
    plans: list = field(default_factory=list)
    notes: tuple[str, ...] = ()

    @property
    def procs_per_node(self) -> int:
        return self.chips_per_node * self.ranks_per_chip

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node

    def run_args(self, recipe: str | None = None, extra: tuple[str, ...] = ()) -> list[str]:
        """`-m forge.cli run RECIPE OVERRIDES`: what torchrun starts in every process."""
        return ["-m", "forge.cli", "run", recipe or self.recipe, *self.overrides, *extra]

    def layout(self) -> dict:
        """The launched layout in the planner's terms (chips, not processes)."""
        return {"chips": self.chips, "nodes": self.nodes, "chips_per_node": self.chips_per_node,
                "tp": 1, "pp": 1, "cp": 1, "dp": self.chips, "zero": STRATEGY_ZERO[self.strategy],
                "processes": self.world, "processes_per_node": self.procs_per_node}

    def record(self) -> dict:
        """launch.json: what was launched, beside the plan it came from."""
        return {"recipe": self.recipe, "target": self.target, "chip": self.chip, "stack": self.stack,
                "strategy": self.strategy, "backend": self.backend, "launched": self.layout(),
                "command": ["torchrun", *self.run_args()], "notes": list(self.notes),
                "plans": [{"stage": p.stage, "chips": p.chips, "layout": p.layout, "layout_detail": p.layout_detail,
                           "step_time_s": p.step_time_s, "hours": p.hours, "cost_usd": p.cost_usd} for p in self.plans]}


def chip_info(system: System) -> dict:
    info = engine_data()["chips"].get(system.chip.key)
    if info is None:
        raise ForgeError(f"forge launch does not know how to start processes on {system.chip.name} "
                         f"(forge/plan/engines.yaml has no entry for chip {system.chip.key!r})")
    if info.get("unsupported"):
        raise ForgeError(f"--target {system.key}: {info['unsupported']}")
    return info


def _strategy(recipe, stack: str) -> tuple[str | None, str]:
    """(the strategy pinned, or None for the planner's choice; a note) from the recipe and the schema."""
    allowed = schema_strategies()
    par = getattr(recipe, "parallelism", None)
    if par is not None and "strategy" in par.model_fields_set:
        return par.strategy, f"parallelism.strategy {par.strategy} from the recipe"
    zeros = set(load_stacks()[stack]["zero"])
    usable = [s for s in allowed if STRATEGY_ZERO.get(s) in zeros]
    if not usable:  # e.g. the fsdp stack (ZeRO-3 only) while the schema has only ddp
        return "ddp", f"the recipe schema has no {'/'.join(s for s, z in STRATEGY_ZERO.items() if z in zeros)} " \
                      f"strategy yet ({', '.join(allowed)}): planned and launched as ddp"
    return (usable[0], "") if len(usable) == 1 else (None, "")


def _pins(strategy: str | None) -> dict:
    pins = {"tp": 1, "pp": 1, "cp": 1}
    if strategy is not None:
        pins["zero"] = STRATEGY_ZERO[strategy]
    return pins


def _plan_at(recipe, system: System, chips: int, ranks: int, stack: str, pins: dict, catalog) -> list[StagePlan]:
    from forge.plan.recipe_plan import recipe_model_config, stage_workload

    config = recipe_model_config(recipe)
    plans = []
    for stage in recipe.stages:
        wl = stage_workload(stage, ranks)      # the global batch of `ranks` data-parallel processes
        if wl is not None:
            plans += compare(config, wl, [(system.key, chips)], Goal(), Setup(stack=stack, layout=pins), catalog)
    return plans


def _chip_count(recipe, system: System, asked: int | None, plan) -> tuple[int, list[StagePlan]]:
    """The chips to launch on: `asked`, else the target's default size (one node, one UltraServer),
    raised to the fewest that fit, or lowered to what the global batch can use."""
    if asked is not None:
        return asked, plan(asked)
    counts = chip_counts(system)
    default = system.default_chips
    order = [default] + [c for c in counts if c > default] + sorted((c for c in counts if c < default), reverse=True)
    first = None
    for n in order:
        plans = plan(n)
        first = first or (n, plans)
        if plans and all(p.feasible for p in plans):
            return n, plans
    return first if first is not None else (default, [])


def plan_launch(recipe_path: str, target: str, nodes: int | None = None, catalog: dict | None = None,
                recipe=None) -> Launch:
    """The job for `recipe_path` on `target` (NAME or NAME:CHIPS), on `nodes` nodes if given; every
    refusal before anything is written."""
    from forge.plan.recipe_plan import recipe_catalog
    from forge.recipe import load_recipe

    recipe = recipe if recipe is not None else load_recipe(recipe_path)
    targets = parse_targets(target)
    if len(targets) != 1:
        raise ForgeError(f"--target {target!r}: forge launch runs on one target (a comma list compares them in forge plan)")
    name, chips = targets[0]
    catalog = catalog if catalog is not None else recipe_catalog(recipe)
    system = get_system(name, catalog)
    info = chip_info(system)
    per_node = max(1, system.chips_per_instance)
    if nodes is not None and nodes < 1:
        raise ForgeError(f"--nodes must be at least 1, got {nodes}")
    if nodes is not None and chips is not None and nodes * per_node < chips:
        raise ForgeError(f"--target {target} needs {chips} chips: more processes than {nodes} node(s) of "
                         f"{system.name} have chips ({nodes} x {per_node}); give --nodes {-(-chips // per_node)}")
    if nodes is not None and chips is None:
        chips = nodes * per_node
    asked_stack = getattr(recipe.compute, "stack", None) or system.default_stack
    stack = launch_stack(asked_stack)
    notes = [] if stack == asked_stack else [f"forge does not run the {asked_stack} stack; launched with {stack}"]
    strategy, why = _strategy(recipe, stack)
    notes += [why] if why else []
    ranks = info["ranks_per_chip"]
    n, plans = _chip_count(recipe, system, chips,
                           lambda c: _plan_at(recipe, system, c, c * ranks, stack, _pins(strategy), catalog))
    if not plans:
        raise ForgeError(f"{recipe_path}: no stage trains, nothing to launch")
    bad = [p for p in plans if not p.feasible]
    if bad:
        p = bad[0]
        raise ForgeError(f"stage {p.stage!r} cannot run data parallel ({strategy or 'ddp/fsdp'}) on {n} x "
                         f"{system.chip.name}: {p.reason.splitlines()[0] if p.reason else 'no layout fits'}")
    zero = plans[0].layout_detail.get("zero", 0)
    strategy = strategy or next(s for s, z in STRATEGY_ZERO.items() if z == zero)
    n_nodes = nodes if nodes is not None else max(1, -(-n // per_node))
    _check_nodes(system, n, n_nodes, per_node)
    overrides = (f"compute.target={system.key}", f"compute.chips={n}", f"compute.stack={stack}",
                 *((f"parallelism.strategy={strategy}",) if strategy in schema_strategies() else ()))
    load_recipe(recipe_path, list(overrides))  # the job's own command must validate
    return Launch(recipe_path, recipe.name, system.key, system.chip.key, stack, strategy, n, n_nodes,
                  min(n, per_node), ranks, info["backend"], overrides, plans, tuple(notes))


def _check_nodes(system: System, chips: int, nodes: int, per_node: int) -> None:
    """A layout the engines cannot run: more processes than the nodes have chips, or part nodes."""
    if chips > nodes * per_node:
        raise ForgeError(f"{chips} chips need {-(-chips // per_node)} node(s) of {system.name} "
                         f"({per_node} chips each); {nodes} given: more processes than the nodes have chips")
    if nodes > 1 and chips != nodes * per_node:
        raise ForgeError(f"{chips} chips on {nodes} nodes of {system.name} ({per_node} chips each) leaves part "
                         f"nodes: give a multiple of {per_node} chips, or one node")
