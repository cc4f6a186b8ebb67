"""The kubelet side: gRPC servers, plugin registration, the health service."""
