"""dra-plugin: a Kubernetes DRA kubelet plugin for GPUs (Intel, NVIDIA and AMD; see vendors/)."""

__version__ = "0.1.0"
