"""Runnable flows, registered by name; the CLI loads them by the name a recipe gives."""
