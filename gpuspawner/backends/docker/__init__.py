"""gpu-docker: DockerSpawner with exact GPUs by UUID in each container's device request."""
