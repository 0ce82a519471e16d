"""The hardware catalog: load forge/plan/hardware.yaml, merge the user's overrides, resolve targets.

The catalog is data (see hardware.yaml); this module only reads it into typed records and
answers questions such as "what is a Trn3 UltraServer's aggregate FP8 compute".
"""
from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from forge.errors import ForgeError

PACKAGE_CATALOG = Path(__file__).with_name("hardware.yaml")
GIB = 2**30


def user_hardware_file() -> Path:
    """The user's override file: $FORGE_HARDWARE_FILE, else ~/.config/forge/hardware.yaml."""
    env = os.environ.get("FORGE_HARDWARE_FILE")
    return Path(env).expanduser() if env else Path("~/.config/forge/hardware.yaml").expanduser()


def deep_merge(base: dict, over: dict) -> dict:
    """Return base updated by over, recursing into dicts (over wins on leaves)."""
    out = copy.deepcopy(base)
    for key, value in (over or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_yaml(path: Path) -> dict:
    """A hardware file's mapping (parsed once per version of the file: planning reads the catalog
    for every anchor it replays)."""
    path = Path(path)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = 0  # read_text below names the problem
    return copy.deepcopy(_parse(str(path), stamp))


@functools.lru_cache(maxsize=16)
def _parse(path: str, stamp: int) -> dict:
    try:
        data = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError as exc:
        raise ForgeError(f"hardware file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ForgeError(f"hardware file {path} must hold a mapping (chips:, systems:, ...)")
    return data


def load_catalog(extra_files: tuple[str | Path, ...] = ()) -> dict:
    """The merged catalog: package file, then the user file if it exists, then extra_files."""
    data = read_yaml(PACKAGE_CATALOG)
    files = [str(PACKAGE_CATALOG)]
    user = user_hardware_file()
    if user.is_file():
        data = deep_merge(data, read_yaml(user))
        files.append(str(user))
    for extra in extra_files:
        path = Path(extra).expanduser()
        if not path.is_file():
            raise ForgeError(f"hardware file {path} does not exist")
        data = deep_merge(data, read_yaml(path))
        files.append(str(path))
    data["files"] = files  # for error messages: which files made this catalog
    return data


def physical_memory_bytes() -> int:
    """This machine's RAM, used as the 'HBM' of the local target."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * GIB


@dataclass(frozen=True)
class Chip:
    """One accelerator (or this machine's CPU for the `local` target)."""

    key: str
    name: str
    status: str
    peak_tflops: dict
    hbm_bytes: float
    hbm_tbps: float
    link_GBps: float
    link_latency_us: float
    chip_w: float
    system_w_per_chip: float
    matmul_efficiency: dict
    calibration: dict = field(default_factory=dict)
    estimated: tuple = ()      # fields the catalog marks `estimate` (no published figure)
    cores: int = 1             # ranks one chip runs under tensor parallelism (NeuronCores: Trainium)

    def precisions(self) -> list[str]:
        return sorted(self.peak_tflops)

    def sustained_flops(self, precision: str, efficiency: float | None = None) -> float:
        """FLOP/s one chip sustains in matmuls: peak x matmul efficiency, or the calibrated rate
        (which, measured end to end on this machine, already includes everything else)."""
        calibrated = (self.calibration or {}).get("effective_tflops", {})
        if efficiency is None and precision in calibrated:
            return float(calibrated[precision]) * 1e12
        eff = efficiency if efficiency is not None else self.default_efficiency(precision)
        return self.peak_flops(precision) * eff

    def peak_flops(self, precision: str) -> float:
        if precision not in self.peak_tflops:
            raise ForgeError(
                f"{self.name} has no {precision} throughput in the catalog; known: {', '.join(self.precisions())}"
            )
        return float(self.peak_tflops[precision]) * 1e12

    def default_efficiency(self, precision: str) -> float:
        """The catalog's achieved-GEMM fraction of peak for `precision` (matmul kernels only)."""
        eff = self.matmul_efficiency
        return float(eff.get(precision, min(eff.values()) if eff else 0.5))


@dataclass(frozen=True)
class System:
    """A system built from chips: an instance, an UltraServer, a node type; priced per chip-hour."""

    key: str
    name: str
    chip: Chip
    default_stack: str
    chips_per_instance: int
    scale_up_chips: int
    default_chips: int
    scale_up_GBps: float
    scale_up_latency_us: float
    scale_out_GBps: float
    scale_out_latency_us: float
    usd_per_chip_hour: float
    price_source: str
    price_date: str
    price_kind: str
    usable_memory_fraction: float
    collective_efficiency: float
    memory_bandwidth_efficiency: float
    max_chips: int

    def ring_bandwidth(self, group_span: int) -> float:
        """Per-direction bytes/s a ring sees: half the (bidirectional) scale-up figure if the group
        fits one scale-up domain, else the per-chip network line rate."""
        one_way = self.scale_up_GBps / 2 if group_span <= self.scale_up_chips else self.scale_out_GBps
        return one_way * 1e9 * self.collective_efficiency

    def hop_latency(self, group_span: int) -> float:
        us = self.scale_up_latency_us if group_span <= self.scale_up_chips else self.scale_out_latency_us
        return us * 1e-6

    @property
    def usable_bytes(self) -> float:
        return self.chip.hbm_bytes * self.usable_memory_fraction


def hbm_bytes_of(raw: dict) -> float:
    """Device memory in bytes from `hbm_gb` (decimal, as AWS and NVIDIA publish) or `hbm_gib`;
    "auto" reads this machine's RAM."""
    if "hbm_gb" in raw:
        hbm, unit = raw["hbm_gb"], 1e9
    else:
        hbm, unit = raw.get("hbm_gib"), GIB
    if hbm in (None, "auto"):
        return float(physical_memory_bytes())
    value = float(hbm)
    if value <= 0:
        raise ValueError(f"device memory must be positive, got {hbm}")
    return value * unit


def _chip(key: str, raw: dict) -> Chip:
    hbm_bytes = hbm_bytes_of(raw)
    return Chip(
        key=key,
        name=str(raw.get("name", key)),
        status=str(raw.get("status", "available")),
        peak_tflops=dict(raw["peak_tflops"]),
        hbm_bytes=hbm_bytes,
        hbm_tbps=float(raw["hbm_tbps"]),
        link_GBps=float(raw["link_GBps"]),
        link_latency_us=float(raw["link_latency_us"]),
        chip_w=float(raw["chip_w"]),
        system_w_per_chip=float(raw.get("system_w_per_chip", raw["chip_w"])),
        matmul_efficiency=dict(raw.get("matmul_efficiency", {})),
        calibration=dict(raw.get("calibration") or {}),
        estimated=tuple(k for k, v in (raw.get("cite") or {}).items() if v == "estimate"),
        cores=int(raw.get("cores", 1)),
    )


def known_targets(catalog: dict | None = None) -> list[str]:
    catalog = catalog if catalog is not None else load_catalog()
    return sorted(catalog.get("systems", {}))


def resolve_name(name: str, catalog: dict) -> str:
    systems = catalog.get("systems", {})
    key = name.strip()
    key = catalog.get("aliases", {}).get(key.lower(), key)
    if key not in systems:
        lowered = {k.lower(): k for k in systems}
        key = lowered.get(key.lower(), key)
    if key not in systems:
        aliases = ", ".join(f"{a} ({t})" for a, t in sorted(catalog.get("aliases", {}).items()))
        raise ForgeError(
            f"unknown target {name!r}. Known targets: {', '.join(known_targets(catalog))}."
            + (f" Aliases: {aliases}." if aliases else "")
        )
    return key


def get_system(name: str, catalog: dict | None = None) -> System:
    """The system called `name` (or one of its aliases); a bad name lists the known ones, and an
    entry with a missing or malformed field names it and the catalog files."""
    catalog = catalog if catalog is not None else load_catalog()
    key = resolve_name(name, catalog)
    try:
        return _system(key, catalog)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        what = f"missing field {e}" if isinstance(e, KeyError) else f"bad value ({e})"
        raise ForgeError(f"hardware catalog entry for {key!r} (or its chip) has a {what}; "
                         f"catalog files: {', '.join(catalog.get('files', []))}") from None


def _system(key: str, catalog: dict) -> System:
    raw = catalog["systems"][key]
    chip_key = raw["chip"]
    if chip_key not in catalog.get("chips", {}):
        raise ForgeError(f"system {key!r} names chip {chip_key!r}, which the catalog does not define")
    defaults = catalog.get("defaults", {})
    price = raw.get("price", {})
    return System(
        key=key,
        name=str(raw.get("name", key)),
        chip=_chip(chip_key, catalog["chips"][chip_key]),
        default_stack=str(raw.get("default_stack", "fsdp")),
        chips_per_instance=int(raw.get("chips_per_instance", 1)),
        scale_up_chips=int(raw.get("scale_up_chips", raw.get("chips_per_instance", 1))),
        default_chips=int(raw.get("default_chips", raw.get("chips_per_instance", 1))),
        scale_up_GBps=float(raw["scale_up_GBps"]),
        scale_up_latency_us=float(raw["scale_up_latency_us"]),
        scale_out_GBps=float(raw["scale_out_GBps"]),
        scale_out_latency_us=float(raw["scale_out_latency_us"]),
        usd_per_chip_hour=float(price.get("usd_per_chip_hour", 0.0)),
        price_source=str(price.get("source", "")),
        price_date=str(price.get("date", "")),
        price_kind=str(price.get("kind", "estimate")),
        usable_memory_fraction=float(raw.get("usable_memory_fraction", defaults.get("usable_memory_fraction", 0.9))),
        collective_efficiency=float(raw.get("collective_efficiency", defaults.get("collective_efficiency", 0.8))),
        memory_bandwidth_efficiency=float(
            raw.get("memory_bandwidth_efficiency", defaults.get("memory_bandwidth_efficiency", 0.7))),
        max_chips=int(raw.get("max_chips", defaults.get("max_chips", 65536))),
    )


def parse_targets(spec: str) -> list[tuple[str, int | None]]:
    """'trn3,trn2-ultraserver,h100:64' -> [('trn3', None), ('trn2-ultraserver', None), ('h100', 64)]."""
    out = []
    for part in (p.strip() for p in str(spec).split(",")):
        if not part:
            continue
        name, _, chips = part.partition(":")
        if not name.strip():
            raise ForgeError(f"target {part!r}: a target name is needed before ':'")
        if chips and not chips.isdigit():
            raise ForgeError(f"target {part!r}: the part after ':' must be a chip count")
        if chips and int(chips) <= 0:
            raise ForgeError(f"target {part!r}: the chip count must be positive")
        out.append((name.strip(), int(chips) if chips else None))
    if not out:
        raise ForgeError("no target given (--target is empty)")
    return out


def system_totals(system: System, chips: int | None = None, precision: str = "fp8") -> dict:
    """Aggregate peak compute, HBM capacity and HBM bandwidth of `chips` chips (default: the system)."""
    n = chips or system.default_chips
    return {
        "chips": n,
        "peak_pflops": system.chip.peak_flops(precision) * n / 1e15,
        "hbm_tb": system.chip.hbm_bytes * n / 1e12,
        "hbm_tbps": system.chip.hbm_tbps * n,
    }
