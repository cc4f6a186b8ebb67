"""dra-plugin: a Kubernetes DRA kubelet plugin for Intel and NVIDIA GPUs."""

__version__ = "0.1.0"
