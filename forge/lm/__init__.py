"""What is done with a language model outside a training step, shared by the stages and the
evaluation suite: generation (Hugging Face or vLLM), held-out perplexity, and reward functions."""
