"""Claim preparation: prepare, unprepare, allocation and sharing rules, claim status."""
