"""The development Kubernetes of the runnable default and the tests: control plane, fake GPU nodes, Kueue."""
