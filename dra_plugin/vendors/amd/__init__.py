"""AMD GPUs (amdgpu): discovery with KFD partitions, ids, RAS watcher, telemetry, doctor
checks, settings."""
