"""Data forge makes itself, for a recipe's `generate: {kind, documents, seed}` source: stories and
facts (generate.py), the quickstart's knowledge base (kb.py) and forge-tiny's curated sets
(curated.py, from the standard library's docstrings: harvest.py, and the skills of instructions.py).
Kept apart from forge.data, which reads and cleans an organization's own data; each is deterministic
in its seed and written once as JSONL (forge.inputs hashes it like any file)."""
