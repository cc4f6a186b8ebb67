"""Benchmarks of dra-plugin, each compared with a floor measured in the same run.

Run `python -m bench` (full, under 5 minutes on 2 cores) or `python -m bench --smoke`
(seconds, for the test suite). The report is JSON (also written to bench/results.json)
plus a short table; every timing is a median and a p99 over repeated runs. See
docs/benchmarks.md for what each figure means.

Modules, by responsibility:
- `stats`: summaries (median, p99) and the report's number formats;
- `floor`: the floor (bare gRPC round trip on a unix socket, fsync'd write, HTTP GET);
- `echo_server`: the trivial grpc.aio server the floor calls (a subprocess);
- `node`: a simulated node around the real daemon (fakes.cluster) for the benches;
- `claims`: prepare latency, the 64-claim burst and the same 64 in one call;
- `held`: prepare/unprepare latency and bytes written with 0, 100, 1,000 claims held,
  one node per level, measured interleaved;
- `startup`: process start to GetInfo and first ResourceSlice, import time, RSS, idle CPU;
- `scale`: 1,000 devices through the publisher, restart with no change;
- `fleet`: hundreds of nodes' publishers against one fake API server;
- `report`: targets, the table, the JSON file;
- `peers` (`python -m bench.peers`, its own run and `bench/peers.json`): the same work
  done by dra-plugin and by the Go reference driver (judges/cmd/refdriver), side by side:
  `peerapi` (the API server both use, the bench's own requests, the slice watch),
  `peerside` (the two driver processes, their nodes, discovery and CDI edits),
  `peermeasure` (the prepare measurements), `peerreport` (rows, ratios, targets).
"""

SCHEMA = 1
