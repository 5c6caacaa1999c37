"""The metrics endpoint under clients that connect and say nothing, or too
little: idle connections take no thread, are closed after the idle timeout,
a scrape is still answered while hundreds are open, and nothing of the
endpoint is left after disable(). The exposition is text or OpenMetrics, as
the scraper asks."""
import socket
import threading
import urllib.request

import torch

import understudy

IDLE = 300


def endpoint_threads():
    return [t for t in threading.enumerate() if t.name.startswith("understudy-metrics")]


def idle_connections(port, n):
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        out.append(s)
    return out


def closed_by_server(s):
    """True once the server closed s (read end of stream), waiting up to the socket's timeout."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def get(port, accept=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def test_idle_connections_take_no_thread_and_a_scrape_is_answered(us):
    us.enable({"operators": {"silu": {"sample": 1.0}}})
    torch.nn.functional.silu(torch.randn(4, 4))
    before = threading.active_count()
    server = understudy.serve_metrics(port=0)
    with_server = threading.active_count()
    socks = idle_connections(server.port, IDLE)
    try:
        assert threading.active_count() == with_server  # no thread per connection
        assert with_server - before == server.threads() <= 3
        status, _, text = get(server.port)
        assert status == 200 and "understudy_calls_total" in text
        assert threading.active_count() == with_server
    finally:
        server.stop()
        for s in socks:
            s.close()
    assert server.threads() == 0 and endpoint_threads() == []
    assert threading.active_count() == before


def test_idle_and_slow_clients_are_closed_after_the_timeout(us):
    us.enable({"operators": {"silu": "observe"}})
    server = understudy.serve_metrics(port=0, idle_timeout_s=0.2)
    try:
        (quiet,) = idle_connections(server.port, 1)
        (slow,) = idle_connections(server.port, 1)
        slow.sendall(b"GET /metr")  # a request line that never ends
        assert closed_by_server(quiet) and closed_by_server(slow)
        assert get(server.port)[0] == 200
    finally:
        server.stop()
        quiet.close()
        slow.close()


def test_the_oldest_idle_connections_make_room(us):
    us.enable({"operators": {"silu": "observe"}})
    server = understudy.metrics.MetricsServer("127.0.0.1", 0, understudy.metrics.UnderstudyCollector(), max_idle=4)
    socks = []
    try:
        socks = idle_connections(server.port, 4)
        newest = idle_connections(server.port, 4)
        socks += newest
        assert all(closed_by_server(s) for s in socks[:4])  # the first four, closed for the next four
        for s in newest:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert b" 200 " in s.recv(64)
    finally:
        server.stop()
        for s in socks:
            s.close()


def test_disable_leaves_nothing_of_the_configured_endpoint(us):
    us.enable({"operators": {"silu": "observe"}, "metrics": {"port": 0}})
    port = int(understudy.metrics.status()["url"].rsplit(":", 1)[1].split("/")[0])
    socks = idle_connections(port, 50)
    try:
        assert 0 < len(endpoint_threads()) <= 3
        us.disable()
        assert endpoint_threads() == []
        assert all(closed_by_server(s) for s in socks)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
            refused = False
        except OSError:
            refused = True
        assert refused
    finally:
        for s in socks:
            s.close()


def test_openmetrics_when_asked(us):
    us.enable({"operators": {"silu": {"sample": 1.0}}})
    torch.nn.functional.silu(torch.randn(4, 4))
    server = understudy.serve_metrics(port=0)
    try:
        _, ctype, text = get(server.port, "application/openmetrics-text; version=1.0.0; charset=utf-8")
        assert ctype.startswith("application/openmetrics-text") and text.rstrip().endswith("# EOF")
        assert "understudy_calls_total" in text or "understudy_calls" in text
        _, ctype, text = get(server.port)
        assert ctype.startswith("text/plain; version=0.0.4") and "# EOF" not in text
    finally:
        server.stop()
