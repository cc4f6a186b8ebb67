"""The kubelet side: gRPC servers, prepare/unprepare, checkpoint, recovery, allocation rules,
health, claim status."""
