"""The floor's gRPC peer: a trivial grpc.aio server on a unix socket (run as a subprocess).

    python -m bench.echo_server /path/to/echo.sock

One unary method, `/bench.Echo/Echo`, answers with the request bytes, with no
(de)serialization: what is left is the cost of a gRPC round trip between two processes,
like the kubelet's call into the plugin. Prints "ready" once serving; stops on SIGTERM or
when its stdin closes.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc

SERVICE = "bench.Echo"
METHOD = f"/{SERVICE}/Echo"


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def serve(socket_path: str) -> None:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.read(1) else None)
    print("ready", flush=True)
    await stop.wait()
    await server.stop(0)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m bench.echo_server SOCKET", file=sys.stderr)
        return 2
    asyncio.run(serve(sys.argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
