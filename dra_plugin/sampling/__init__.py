"""GPU telemetry sampled while the daemon runs: one pass per interval through each
vendor's reader (sampler.py), and which claim and pod hold each device (claimholders.py).
The values and their exposition are one floor down, in telemetry/."""
