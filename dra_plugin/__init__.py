"""dra-plugin: a Kubernetes DRA kubelet plugin for GPUs (one folder per vendor under vendors/)."""

__version__ = "0.1.0"
