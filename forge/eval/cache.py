"""Figures the suite already measured in a run folder (`eval/measured.json`), keyed by the model's
weights (content hash) and the suite (its settings and data), so an evaluation made when a stage
ended is neither redone at the end of the run nor on `--resume`; the Novella, a copy of the last
stage's weights, reuses that stage's figures. Also records which MLflow runs already got them.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

# What the figures depend on besides the weights: not the gates, the card text or the time budget.
_NOT_FIGURES = {"gates", "intended_use", "limitations", "time_budget_s", "after_each_stage", "primary"}
_MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "adapter_config.json")


def suite_key(suite, data: dict[str, str]) -> str:
    """The resolved suite's settings and the fingerprints of the data it reads."""
    text = suite.model_dump_json(exclude=_NOT_FIGURES) + json.dumps(sorted(data.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class EvalCache:
    """{suite: key, models: {weights hash: {label, path, metrics, runs}}, stat: {path: [size, mtime, hash]}}."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = Path(path), key
        data = json.loads(self.path.read_text()) if self.path.is_file() else {}
        fresh = data.get("suite") == key
        self.models: dict[str, dict] = data.get("models", {}) if fresh else {}
        self._stat: dict[str, list] = data.get("stat", {})

    def fingerprint(self, folder: Path) -> str:
        """sha256 over the weights, config and tokenizer files (a file unchanged since it was last
        hashed, by size and mtime, is not read again)."""
        files = sorted(p for p in Path(folder).iterdir() if p.suffix == ".safetensors" or p.name in _MODEL_FILES)
        parts = []
        for f in files:
            st = f.stat()
            seen = self._stat.get(str(f.resolve()))
            if seen is None or seen[:2] != [st.st_size, st.st_mtime_ns]:
                seen = self._stat[str(f.resolve())] = [st.st_size, st.st_mtime_ns, _file_hash(f)]
            parts.append(f"{f.name}:{seen[2]}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def get(self, folder: Path) -> dict[str, float] | None:
        hit = self.models.get(self.fingerprint(folder))
        return dict(hit["metrics"]) if hit else None

    def put(self, folder: Path, label: str, metrics: dict[str, float]) -> None:
        entry = self.models.setdefault(self.fingerprint(folder), {"runs": []})
        entry.update({"label": label, "path": str(folder), "metrics": dict(metrics)})
        self.save()

    def logged(self, folder: Path, run_id: str) -> bool:
        """Whether MLflow run `run_id` already holds this model's figures."""
        hit = self.models.get(self.fingerprint(folder))
        return bool(hit) and run_id in hit["runs"]

    def mark_logged(self, folder: Path, run_id: str) -> None:
        hit = self.models.get(self.fingerprint(folder))
        if hit is not None and run_id not in hit["runs"]:
            hit["runs"].append(run_id)
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"suite": self.key, "models": self.models, "stat": self._stat}, indent=2))
        tmp.replace(self.path)
