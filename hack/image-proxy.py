#!/usr/bin/env python3
"""An HTTPS proxy for the Tekton controller in the real-kubelet lane (TEKTON_MUTEX_KUBELET=real).

When a step has no `command`, Tekton's controller reads the image's entrypoint from its registry
(pkg/pod/entrypoint_lookup_impl.go: remote.Get over Go's default transport, which honours
HTTPS_PROXY). Here every image lives in the local registry, and nothing may leave the machine. The
controller runs with HTTPS_PROXY pointing at this proxy, which answers `CONNECT <registry>:443` for
the registry names containerd mirrors (docker.io & co.) by terminating TLS with a certificate of
the cluster's CA (the controller's SSL_CERT_FILE) and passing the requests on to the local
registry, unchanged (a registry ignores the Host header; docker.io's `library/` paths are pushed
as such). Any other host, and any plain-HTTP request, gets 403: no connection leaves loopback.

    image-proxy.py --listen 127.0.0.1:PORT --registry 127.0.0.1:PORT --cert CRT --key KEY --hosts H,H
"""
import argparse
import socket
import ssl
import sys
import threading


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def read_head(conn):
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        head += chunk
        if len(head) > 65536:
            return None
    return head


def serve(conn, args, ctx, hosts):
    upstream = None
    try:
        head = read_head(conn)
        if head is None:
            return
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        target = parts[1] if len(parts) >= 2 else ""
        host = target.rsplit(":", 1)[0].lower()
        if len(parts) < 3 or parts[0] != "CONNECT" or host not in hosts:
            print(f"refused: {line}", flush=True)
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        tls = ctx.wrap_socket(conn, server_side=True)
        reg_host, reg_port = args.registry.rsplit(":", 1)
        upstream = socket.create_connection((reg_host, int(reg_port)))
        print(f"tunnel: {host} -> {args.registry}", flush=True)
        t = threading.Thread(target=pipe, args=(upstream, tls), daemon=True)
        t.start()
        pipe(tls, upstream)
        t.join(timeout=30)
    except (OSError, ssl.SSLError) as e:
        print(f"error: {e}", flush=True)
    finally:
        for s in (conn, upstream):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--registry", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--hosts", required=True)
    args = p.parse_args()
    hosts = {h.strip().lower() for h in args.hosts.split(",") if h.strip()}
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    host, port = args.listen.rsplit(":", 1)
    if not socket.inet_aton(host)[0] == 127:
        sys.exit("the proxy listens on loopback only")
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(64)
    print(f"image-proxy listening on {args.listen}, registry {args.registry}", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn, args, ctx, hosts), daemon=True).start()


if __name__ == "__main__":
    main()
