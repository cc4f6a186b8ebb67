"""Intel GPUs (i915, xe): discovery, PCI-id table, telemetry, doctor checks, settings."""
