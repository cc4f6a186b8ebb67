"""`dra-plugin doctor`: the report (report.py), vendor-neutral node, containerd and CDI-root
checks; each vendor adds its own. What a check finds is in findings/."""
