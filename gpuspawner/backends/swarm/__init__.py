"""gpu-swarm: SwarmSpawner with GPUs as the nodes' generic resources; subclasses gpu-docker's spawner."""
