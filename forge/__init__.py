"""forge: recipe-driven customization of language models, tracked in MLflow."""
__version__ = "0.1.0"
