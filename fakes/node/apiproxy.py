"""The `kubernetes` Service's ClusterIP on the node, for its pods: what kube-proxy does for
that one Service, without kube-proxy.

A pod finds the API server as every in-cluster client does: KUBERNETES_SERVICE_HOST and
_PORT (the kubelet sets them from the `kubernetes` Service in `default`, ClusterIP the
first address of --service-cluster-ip-range) and the CA from the kube-root-ca.crt
ConfigMap. The node has no kube-proxy, so nothing would answer that address. Here the
bridge holds the ClusterIP as a local address (config.bridge_commands; pods reach it
through their default route, the bridge's gateway) and this forwarder listens on it, at
the Service's port, passing TCP through to the API server on 127.0.0.1. TLS is end to end
(the API server's certificate names the ClusterIP, as kubeadm's does), so what the pod
meets is the real server; only the address translation is ours.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from fakes.node.config import SERVICE_IP

SERVICE_PORT = 443


class Forwarder:
    """TCP from (SERVICE_IP, SERVICE_PORT) to 127.0.0.1:`port`, one thread per direction."""

    def __init__(self, port: int, host: str = SERVICE_IP, listen_port: int = SERVICE_PORT):
        self.target = ("127.0.0.1", port)
        self._listener = socket.create_server((host, listen_port), reuse_port=False)
        self._listener.settimeout(0.5)
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="api-forwarder", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._conns.discard(s)
            s.close()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(5)
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
