"""What a node check finds (findings.py) and the helpers doctor's and each vendor's checks
share (checks.py). The doctor that runs them and renders the report is in doctor/."""
