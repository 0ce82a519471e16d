"""The shared training core: a stage's session (session.py), the one training loop (loop.py) and
its optimizer step (step.py), the checkpoint interface (checkpointer.py, over the folder format
of checkpoint.py) behind the parallelism seam (parallel.py), and the losses, schedules, meter,
progress and signal handling the loop uses. It never imports the recipe."""
