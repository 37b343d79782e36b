"""gpuspawner: exclusive GPUs for JupyterHub users."""

__version__ = "0.1.0"
