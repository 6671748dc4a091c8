"""A tiny TCP "engine" for tests and benchmarks; run as a script, imports nothing of twinkle.

``python -I -S _ping_server.py NAME [--fd FD]... [--port PORT]... [--host HOST]
[--init-delay-s T]``

Sleeps ``T`` seconds (the engine's "initialisation"), serves on every inherited
listening socket (``--fd``) and binds every ``--port`` itself on ``HOST``, prints
``ready <port> <port>...`` on stdout, then answers each line received on any connection
with ``pong NAME <port>``. Exits when stdin reaches EOF (the parent closed it or died),
so it never outlives its parent. A failed bind exits with status 98 and the reason on
stderr.
"""

import os
import selectors
import socket
import sys
import time


def main(argv: list[str]) -> int:
    name = argv[0]
    fds: list[int] = []
    ports: list[int] = []
    host = "127.0.0.1"
    delay_s = 0.0
    i = 1
    while i < len(argv):
        opt, val = argv[i], argv[i + 1]
        i += 2
        if opt == "--fd":
            fds.append(int(val))
        elif opt == "--port":
            ports.append(int(val))
        elif opt == "--host":
            host = val
        elif opt == "--init-delay-s":
            delay_s = float(val)
        else:
            sys.stderr.write(f"unknown option {opt!r}\n")
            return 2
    time.sleep(delay_s)
    listeners = [socket.socket(fileno=fd) for fd in fds]
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sys.stderr.write(f"{name}: cannot bind {host}:{port}: {exc}\n")
            return 98
        listeners.append(sock)
    sel = selectors.DefaultSelector()
    for sock in listeners:
        sock.listen(64)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, sock)
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, None)
    listening = set(listeners)
    served = " ".join(str(s.getsockname()[1]) for s in listeners)
    sys.stdout.write(f"ready {served}\n")
    sys.stdout.flush()
    buffers: dict[socket.socket, bytes] = {}
    while True:
        for key, _ in sel.select():
            obj = key.data
            if obj is None:  # stdin
                if not os.read(key.fd, 4096):
                    return 0
            elif obj in listening:
                conn, _ = obj.accept()
                conn.setblocking(False)
                buffers[conn] = b""
                sel.register(conn, selectors.EVENT_READ, conn)
            else:
                _serve(sel, obj, buffers, name)


def _serve(
    sel: selectors.BaseSelector, conn: socket.socket, buffers: dict[socket.socket, bytes], name: str
) -> None:
    try:
        data = conn.recv(4096)
    except OSError:
        data = b""
    if not data:  # the client closes first, so TIME_WAIT stays on its side
        sel.unregister(conn)
        buffers.pop(conn, None)
        conn.close()
        return
    buf = buffers[conn] + data
    port = conn.getsockname()[1]
    while b"\n" in buf:
        _, buf = buf.split(b"\n", 1)
        conn.sendall(f"pong {name} {port}\n".encode())
    buffers[conn] = buf


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
