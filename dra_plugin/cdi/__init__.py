"""CDI specs for prepared claims: pure rendering (claims.py) and the specification's rules
(rules.py)."""
