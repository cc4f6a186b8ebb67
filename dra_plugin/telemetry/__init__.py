"""GPU telemetry: the series catalogue, the background sampler, Prometheus exposition."""
