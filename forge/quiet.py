"""Quiet the libraries under forge's commands (transformers' progress bars and advisories, the
tokenizers' fork warning, MLflow's INFO lines) so that `forge run` and `forge eval` print only
forge's own lines."""
from __future__ import annotations

import os


def quiet_libraries() -> None:
    """Library progress bars and advisories only clutter forge's own output."""
    import transformers

    from forge.track import quiet_mlflow

    quiet_mlflow()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
