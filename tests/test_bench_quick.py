"""Every benchmark's quick mode (what CI runs of bench/): it exits 0 and prints its side-by-side ratio
table. Timings are not asserted (ratios belong in bench/RESULTS.md); the table's rows are."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from forge_testing import REPO, SHARED

# benchmark -> (its quick command's arguments, the rows its table must hold, needs ../shared/data)
QUICK = {
    "bench_attention.py": (["--quick"], ["head_dim 8, 8 heads, 4 x 256", "head_dim 32, 4 heads, 2 x 512"], False),
    "bench_pretrain.py": (["--quick"], ["bare loop (same blocks)", "forge pretrain stage"], False),
    "bench_sft.py": (["--quick"], ["forge (packed best-fit)", "bare loop (same packed batches)",
                                   "bare loop, denormals not flushed", "TRL SFTTrainer defaults", "HF Trainer (padded)"], True),
    "bench_kinds.py": (["--quick"], ["DPO: forge DPO stage", "RFT the steps on forge's rollouts: forge",
                                     "RFT rollouts + steps: forge"], False),
    "bench_fsdp.py": (["--quick"], ["ddp: tokens/s (2 ranks)", "fsdp: tokens/s (2 ranks)",
                                    "fsdp: rank 1's peak memory during the stage, MiB"], False),
    "bench_predict.py": (["--quick"], ["predicted (guess) ÷ measured", "predicted (measured) ÷ measured"], False),
    "bench_async_rollout.py": (["--quick"], ["sync (on_policy)", "async (off_policy_async, max_age 1)"], False),
    "bench_hygiene.py": (["--quick"], ["read", "pii", "dedup_near", "all"], True),
    "bench_gpu.py": (["--quick"], [], False),
    "bench_plan.py": ([], [], False),
    "bench_data.py": (["--workers", "1,2", "--quick"], [], False),  # runs bench_workers.py
    "bench_memory.py": (["--quick"], [], False),
    "bench_serve.py": (["--quick"], ["forge's SFT step (in-process)", "Tinker API (SDK -> forge serve)"], False),
    "bench_omp.py": (["--quick"], ["libgomp default (spin 300,000), idle", "GOMP_SPINCOUNT=3000 (forge), idle",
                                   "OMP_WAIT_POLICY=PASSIVE (never spin), a busy loop on one core"], False),
}
NO_QUICK_YET = {"bench_workers.py"}  # a module of bench_data.py --workers (its quick mode above)


def table_rows(out: str) -> dict[str, list[str]]:
    """The first cells of the Markdown ratio table benchlib prints: {title: [row names]}."""
    tables: dict[str, list[str]] = {}
    lines = out.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("| ") and re.fullmatch(r"\|(---\|)+", lines[i + 1]):
            title = line.split("|")[1].strip()
            tables[title] = [row.split("|")[1].strip() for row in lines[i + 2:] if row.startswith("| ")]
    return tables


def test_every_benchmark_has_a_quick_command():
    found = {p.name for p in (REPO / "bench").glob("bench_*.py")}
    assert found - NO_QUICK_YET <= set(QUICK), sorted(found - NO_QUICK_YET - set(QUICK))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICK))
def test_quick_mode_prints_its_ratio_table(name, tmp_path):
    args, rows, shared = QUICK[name]
    if not (REPO / "bench" / name).is_file():
        pytest.skip(f"bench/{name} is not in this checkout")
    if shared and not SHARED.exists():
        pytest.skip(f"{SHARED} is absent (this benchmark reads ../shared/data)")
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "2", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "bench" / name), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    if name == "bench_plan.py":  # its own side-by-side form: the catalog's headline ratios, each target vs Trn2
        assert "Trn3 UltraServer / Trn2 UltraServer: FP8 compute" in done.stdout
        assert re.search(r"time +[\d.]+x +cost +[\d.]+x .*\(vs trn2-ultraserver\)", done.stdout), done.stdout
        return
    if name == "bench_gpu.py":  # its own table: each mode's tokens/s, x eager, MFU, memory, step and plan
        assert re.search(r"^mode +tok/s +x eager", done.stdout, re.M) and re.search(r"^eager +[\d,]+ +1\.00",
                                                                                   done.stdout, re.M), done.stdout
        return
    if name == "bench_data.py":  # per phase: 1 and 2 workers side by side, the ratio, the outputs' identity
        assert re.search(r"^hygiene records/s +[\d,]+ +[\d,]+ +[\d.]+$", done.stdout, re.M), done.stdout
        assert "at [1, 2] workers: yes" in done.stdout, done.stdout
        return
    if name == "bench_memory.py":  # each phase's peak at the two sizes and their ratio
        assert re.search(r"^hygiene_peak_mb .* ratio [\d.]+x \(corpus 2x\)", done.stdout, re.M), done.stdout
        return
    tables = table_rows(done.stdout)
    title = name.removesuffix(".py")
    assert title in tables, done.stdout[-3000:]
    assert tables[title] and all(any(r in row for row in tables[title]) for r in rows), tables[title]
