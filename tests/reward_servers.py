"""Local HTTP reward servers that misbehave on purpose (one thread each, on 127.0.0.1)."""

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def serve(answer):
    """Yields the server's URL; `answer(handler)` writes each POST's reply (the body is read first)."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            answer(self)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/score"
    finally:
        httpd.shutdown()
        httpd.server_close()


def scores(values):
    """An answer of {"scores": values} (json writes inf and nan as Infinity and NaN)."""
    def answer(handler):
        body = json.dumps({"scores": values}).encode()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    return answer
