"""`dra-plugin doctor`: the report (report.py), vendor-neutral node and containerd checks; each
vendor adds its own."""
