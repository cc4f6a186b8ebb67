"""The real Kubernetes components as judges: programs in judges/ (a Go module of their own)
built from the upstream Go modules, and the Python side that starts and drives them."""
