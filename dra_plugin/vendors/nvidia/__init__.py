"""NVIDIA GPUs: NVML (nvml/, the only pynvml importer), device model, CDI userspace, health,
telemetry, doctor, settings."""
