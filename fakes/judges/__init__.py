"""The real-component judges' Python harness, shared by tests/judges and bench/judges.py:
build.py builds judges/cmd/* (Go) once per source key; apiserver.py runs the real
kube-apiserver on 127.0.0.1 with a small admin client."""
