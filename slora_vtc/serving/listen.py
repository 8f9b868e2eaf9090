"""The socket `serve` and the gateway listen on, bound before anything slow starts (a model loading,
upstreams answering): a port in use or a host that is not this machine's is one line, at once, and not
uvicorn's log lines and exit status 3 after the wait. uvicorn then serves on it (`Server.run(sockets=...)`),
with the backlog its config names."""

import socket

from slora_vtc.errors import UserError


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart may take the port at once
    try:
        sock.bind((host, port))
    except OSError as e:  # in use, not this machine's address, or a name that does not resolve
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    return sock
