"""A real single Kubernetes node for the plugin (issue 48): the real kube-apiserver,
kube-controller-manager, kube-scheduler and kubelet of k8s.io/kubernetes, containerd with
runc, and `dra-plugin run` as a host process on a simulated GPU node.

- config.py: the node's directory layout and its components' configuration files;
- images.py: the sandbox and busybox images, made locally as OCI archives;
- cleanup.py: taking a node (or a killed run's leftovers) down completely;
- node.py: bringing the node up and its components' lifecycle;
- plugin.py: the plugin as a host process on the simulated GPUs; nvidia.py: its NVIDIA
  driver root (the stand-in NVML and a static nvidia-smi);
- workloads.py: what a user does with kubectl: DeviceClasses from the chart, the
  examples applied, pods awaited, logs, claims and CDI specs read;
- __main__.py: `python -m fakes.node smoke|up|down`.
"""
