"""Evaluation of models against the starting checkpoint (forge.eval): evaluators (perplexity per
source and fact recall through forge.lm, retention, preference accuracy, mean reward, custom,
lm-eval), the suite runner and its cache, the comparison report, gates, registry aliases, the
model card, the end of a Novella run (finish), evaluation after each stage, and `forge eval`."""
