"""Quiet the libraries under forge's commands (transformers' progress bars and advisories, the
tokenizers' fork warning, MLflow's INFO lines and artifact progress bars, botocore's request
details) so that `forge run`, `forge eval`, `forge export` and `forge deploy` print only forge's own lines."""
from __future__ import annotations

import logging
import os


def quiet_libraries() -> None:
    """Library progress bars and advisories only clutter forge's own output."""
    import transformers

    from forge.track import quiet_mlflow

    quiet_mlflow()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # never echo request details
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
