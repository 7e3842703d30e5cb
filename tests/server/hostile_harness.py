#!/usr/bin/env python3
"""The harness of test_hostile_clients.py: the server under test, raw HTTP clients, check() and
the bounds every attack is held to."""
import json
import re
import signal
import socket
import subprocess
import threading
import time

SKIP = 77
failures = []
HEALTH_BOUND_S = 1.0      # /health under attack (it answers in ~1 ms; the bound allows a busy CI box)
COMPLETION_BOUND_S = 15.0  # a 2-token completion under attack
RSS_GROWTH_BOUND_MB = 400


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


class Server:
    def __init__(self, tandem, model, extra=(), env=None):
        self.proc = subprocess.Popen([tandem, "serve", "-m", model, "--port", "0", "--kv-memory", "256MiB", *extra],
                                     stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.time() + 90
        self.port = None
        while time.time() < deadline and self.port is None:
            line = self.proc.stderr.readline()
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("tandem serve did not start")
        self.sanitizer_reports = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.host = f"127.0.0.1:{self.port}"
        self.rss0 = None
        # ASan's shadow memory and quarantine grow RSS by hundreds of MB on their own.
        with open(f"/proc/{self.proc.pid}/maps") as f:
            self.rss_bound_mb = RSS_GROWTH_BOUND_MB * (3 if "libasan" in f.read() else 1)

    def _drain_stderr(self):  # keeps the pipe from filling; sanitizer reports fail the test
        for line in self.proc.stderr:
            if "Sanitizer" in line or "runtime error" in line:
                self.sanitizer_reports.append(line.strip())
                print("     server: " + line.rstrip(), flush=True)

    def rss_mb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        time.sleep(0.2)  # the last stderr lines
        check(not self.sanitizer_reports, f"no sanitizer reports from the server ({len(self.sanitizer_reports)})")


def under_asan(srv):
    return srv.rss_bound_mb != RSS_GROWTH_BOUND_MB


def exit_code(srv, timeout):
    """The server's exit code, or None if it is still running after `timeout` seconds."""
    try:
        return srv.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def sigterm(srv):
    """Sends SIGTERM; returns the exit code (None if still running after 10 s) and the seconds taken."""
    t = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    return exit_code(srv, 10), time.time() - t


# ---- raw HTTP ---------------------------------------------------------------------------------

def connect(port, timeout=30, rcvbuf=None, source=None):
    """A loopback connection; `source` binds another 127/8 address (another client to the server)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if source:
        s.bind((source, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


class Reader:
    """Reads HTTP/1.1 responses (Content-Length or chunked) off a socket, one after another."""

    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, on_first_chunk=None):
        """One response; on_first_chunk() runs once the first chunk of a chunked body is in."""
        status_line = self._line()
        while status_line.startswith(b"HTTP/1.1 100"):  # 100 Continue
            self._line()
            status_line = self._line()
        status = int(status_line.split()[1])
        headers = {}
        while True:
            line = self._line()
            if not line:
                break
            k, v = line.split(b":", 1)
            headers[k.decode().lower()] = v.strip().decode()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                n = int(self._line().split(b";")[0], 16)
                if n == 0:
                    self._line()
                    break
                body += self._exact(n)
                self._exact(2)
                if on_first_chunk:
                    on_first_chunk()
                    on_first_chunk = None
        else:
            body = self._exact(int(headers.get("content-length", "0")))
        return status, headers, body


def request_bytes(method, path, host, body=b"", headers=None, content_type="application/json"):
    h = {"Host": host}
    if method == "POST" and content_type is not None:
        h["Content-Type"] = content_type
    h.update(headers or {})
    if method == "POST":
        h["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode() + body


def http(srv, method, path, body=b"", headers=None, content_type="application/json", timeout=60, host=None):
    s = connect(srv.port, timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        s.sendall(request_bytes(method, path, host or srv.host, body, headers, content_type))
        return Reader(s).response()
    finally:
        s.close()


def error_of(body):
    try:
        return json.loads(body).get("error", {})
    except Exception:
        return {}


def metric(srv, name, key=None):
    _, _, text = http(srv, "GET", "/metrics", headers={"Authorization": f"Bearer {key}"} if key else None)
    for line in text.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return 0.0


CANCELLED = 'tandem_requests_finished_total{reason="cancelled"}'


def healthy(srv, label, key=None):
    """The server is alive, answers /health fast and a small completion in bounded time, RSS bounded."""
    alive = srv.proc.poll() is None
    t = time.time()
    try:
        st, _, _ = http(srv, "GET", "/health", timeout=HEALTH_BOUND_S + 5)
    except Exception as e:
        st = str(e)
    dt_h = time.time() - t
    t = time.time()
    try:
        hdr = {"Authorization": f"Bearer {key}"} if key else None
        st2, _, body = http(srv, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0}, headers=hdr,
                            timeout=COMPLETION_BOUND_S + 5)
        ok2 = st2 == 200 and json.loads(body)["usage"]["completion_tokens"] >= 1
    except Exception as e:
        ok2, st2 = False, str(e)
    dt_c = time.time() - t
    rss = srv.rss_mb() if alive else 0
    srv.rss0 = srv.rss0 or rss
    check(alive and st == 200 and dt_h < HEALTH_BOUND_S and ok2 and dt_c < COMPLETION_BOUND_S
          and rss - srv.rss0 < srv.rss_bound_mb and not srv.sanitizer_reports,
          f"{label}: alive, /health {st} in {dt_h * 1000:.1f} ms, completion {st2} in {dt_c * 1000:.0f} ms, "
          f"RSS {rss:.0f} MB (start {srv.rss0:.0f} MB)")
    return dt_h


# ---- attacks ----------------------------------------------------------------------------------

def sse_events(body):
    """Decodes an SSE body strictly as UTF-8 and parses every data line as JSON."""
    text = body.decode("utf-8")  # raises on invalid UTF-8
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ") and line != "data: [DONE]"]
