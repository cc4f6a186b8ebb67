"""GPU telemetry as values and their exposition: the series catalogue (catalogue.py) and
Prometheus metrics with /healthz (metrics.py). The sampler that fills them is in
sampling/."""
