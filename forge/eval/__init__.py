"""Evaluation of models against the starting checkpoint (forge.eval): evaluators (perplexity per
source, retention, fact recall, preference accuracy, custom, lm-eval), the suite runner, the
comparison report, gates, registry aliases, the model card, and `forge eval`."""
