"""FSDP2 (`torch.distributed.fsdp.fully_shard`): sharding a Hugging Face model per decoder layer and
at its root, and what the loop and the checkpointer do differently with a sharded model: gradient
sync only on a step's last micro-batch, the clipped norm over every shard, the weights gathered
(vLLM weight sync, the final save) and the optimizer state in the plain, whole-model form a
data-parallel checkpoint has. Device-agnostic: the mesh is built on the model's device type.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, cast

import torch
from torch.optim.optimizer import StateDict

from forge.errors import ForgeError
from forge.train.accel import group_backend, pins_memory
from forge.train.settings import ParallelismSettings

if TYPE_CHECKING:  # the libraries load with a session, not with the module
    from peft import PeftModel
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Options:
    """The recipe's `parallelism:` block (forge.recipe.schema.Parallelism), or a strategy name alone."""

    strategy: str = "ddp"
    sharding: str = "full"          # full: one shard group; hybrid: shard within a node, replicate across
    mixed_precision: str = "none"   # bf16: bf16 parameters in compute, fp32 gradient reduction
    activation_checkpointing: bool = False
    cpu_offload: bool = False


def options(spec: ParallelismSettings | str) -> Options:
    """Options from a strategy name or a `parallelism:` block."""
    if isinstance(spec, str):
        return Options(spec)
    return Options(spec.strategy, spec.sharding, spec.mixed_precision, bool(spec.activation_checkpointing),
                   bool(spec.cpu_offload))


def hf_model(model: torch.nn.Module) -> PreTrainedModel:
    """The transformers model itself (inside a PEFT wrapper when adapters train): a session's model
    is one (forge.train.checkpointer loads it)."""
    inner = cast("PeftModel", model).get_base_model() if hasattr(model, "get_base_model") else model
    return cast("PreTrainedModel", inner)


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant)."""
    hf = hf_model(model)  # its gradient_checkpointing_enable is unannotated in transformers
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[no-untyped-call]


def decoder_layers(hf: torch.nn.Module, why: str = "parallelism.strategy: fsdp",
                   fix: str = "use strategy ddp") -> list[torch.nn.Module]:
    """The decoder layers: the modules transformers never splits across devices (`_no_split_modules`)."""
    names = set(getattr(hf, "_no_split_modules", None) or [])
    found = [m for m in hf.modules() if type(m).__name__ in names]
    if not found:
        raise ForgeError(f"{why}: cannot find the decoder layers of {type(hf).__name__} "
                         f"(no _no_split_modules); {fix}")
    return found


def _mesh(device: torch.device, sharding: str) -> DeviceMesh:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.distributed_c10d import Store

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not dist.is_initialized() and world == 1:  # one process without a launcher: a group of one
        backend = group_backend(device)
        store: Store = getattr(dist, "HashStore")()  # an in-memory one (not among torch's typed exports)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    if sharding == "full":
        return init_device_mesh(device.type, (world,))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world % local:
        raise ForgeError(f"parallelism.sharding: hybrid needs the same number of processes on every node "
                         f"({world} processes, {local} on this node)")
    return init_device_mesh(device.type, (world // local, local), mesh_dim_names=("replicate", "shard"))


def _outside(hf: torch.nn.Module, layers: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The modules outside the decoder layers that hold parameters (embeddings, final norm, head)."""
    inside = {id(m) for layer in layers for m in layer.modules()}
    return [m for m in hf.modules() if id(m) not in inside and any(True for _ in m.parameters(recurse=False))]


def shard(model: torch.nn.Module, opts: Options, device: torch.device) -> torch.nn.Module:
    """fully_shard each decoder layer, the modules outside them as one group (each unshards it when it
    runs, so the weights are whole whichever module a call enters by: PEFT calls the transformers
    model's `forward` directly, and `generate` calls it, not the wrapper), then the outermost model as
    the root, initialised by one forward pass. The transformers model is marked FSDP-managed, so its
    `generate` keeps every rank stepping until all have finished (synced_gpus): generation runs on the
    sharded weights, every rank taking part."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    model.to(device)
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if opts.mixed_precision == "bf16" else MixedPrecisionPolicy())
    offload = CPUOffloadPolicy(pin_memory=pins_memory(device)) if opts.cpu_offload else OffloadPolicy()
    mesh = _mesh(device, opts.sharding)
    hf = hf_model(model)
    layers = decoder_layers(hf)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload)
    outside = _outside(hf, layers)
    if outside:
        fully_shard(outside, mesh=mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    setattr(hf, "_is_fsdp_managed_module", True)  # transformers' generate: synced_gpus under sharding
    was = model.training
    with torch.no_grad():  # the root's lazy initialisation, before any call could enter below it
        model.eval()(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))
    return resharded(model.train(was))


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def _fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Accumulate gradients unreduced (a step's micro-batches before its last)."""
    modules = _fsdp_modules(model)
    for m in modules:
        m.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for m in modules:
            m.set_requires_gradient_sync(True, recurse=False)


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """The global gradient norm over every shard (clipped to `max_norm`), as DDP's clip reports it,
    on the device."""
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """The whole parameters in place of the shards (every rank takes part), e.g. to copy them into
    vLLM; resharded on exit."""
    modules = _fsdp_modules(model)
    for m in modules:
        m.unshard()
    try:
        yield
    finally:
        for m in modules:
            m.reshard()


def resharded(model: torch.nn.Module) -> torch.nn.Module:
    """The model with every parameter back in its shard. The root keeps its whole parameters after a
    forward pass (FSDP2 expects the backward next), so after evaluation or generation the module would
    hold other tensors than the optimizer's; state dicts are taken after this."""
    for m in _fsdp_modules(model):
        m.reshard()
    return model


def full_model_state(model: torch.nn.Module) -> StateDict:
    """The whole model's state dict on CPU, on rank 0 (a collective: every rank calls it; others get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    resharded(model)
    state: StateDict = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> StateDict:
    """The optimizer's whole state on rank 0 in `optimizer.state_dict()`'s own form (parameters by
    index, in the optimizer's order), so a data-parallel stage can carry it over (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    resharded(model)
    named: StateDict = get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not named:
        return {}
    index: dict[str, int] = {}
    groups = []
    for group in named["param_groups"]:
        ids = [index.setdefault(fqn, len(index)) for fqn in group["params"]]
        groups.append({**group, "params": ids})
    return {"state": {index[k]: v for k, v in named["state"].items() if k in index}, "param_groups": groups}


def load_full_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: StateDict) -> None:
    """Load a whole-model optimizer state (by index, as `optimizer.state_dict()` gives it) into the
    sharded optimizer (optim.carry_over under fsdp)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    resharded(model)
    names = {id(p): n for n, p in model.named_parameters()}
    fqns = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    if len(fqns) != sum(len(g["params"]) for g in saved["param_groups"]):
        raise ValueError(f"{len(fqns)} parameters train here, the saved state has "
                         f"{sum(len(g['params']) for g in saved['param_groups'])}")
    keys = set(optimizer.param_groups[0]) if optimizer.param_groups else set()  # not an old schedule's initial_lr
    named: StateDict = {"state": {fqns[int(i)]: v for i, v in saved["state"].items()},
                             "param_groups": [{**{k: v for k, v in g.items() if k in keys},
                                               "params": [fqns[int(i)] for i in g["params"]]}
                                              for g in saved["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))
