"""Hub-side operations: the admin GPU overview (page and API), Prometheus metrics,
the GPU-aware idle culler service and :func:`setup.configure` that wires them into
a JupyterHub configuration."""
