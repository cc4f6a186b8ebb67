"""Values as the Kubernetes API writes them: quantities, and JSON objects as decoded."""
