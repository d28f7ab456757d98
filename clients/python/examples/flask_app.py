"""A Flask app limited by Flask-Limiter on xcloak: the one-line switch.

    RATELIMIT_STORAGE_URI=xcloak://127.0.0.1:6379 python examples/flask_app.py [PORT]

``import xcloak.limits`` registers the xcloak:// schemes with limits; then
Flask-Limiter's ``storage_uri`` takes ``xcloak://`` where it took ``redis://``,
with the moving-window strategy (limits' exact sliding log) answered by
XCLOAK.ALLOW / XCLOAK.PEEK (or the bundled Lua script on a server without the
module). ``GET /`` allows 3 a minute and 10 an hour per client address, with
the rate-limit headers on every response.
"""

import os
import sys

from flask import Flask
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

import xcloak.limits  # noqa: F401  registers xcloak://, xcloak+cluster://, ... with limits

app = Flask(__name__)
limiter = Limiter(
    get_remote_address,
    app=app,
    storage_uri=os.environ.get("RATELIMIT_STORAGE_URI", "xcloak://127.0.0.1:6379"),
    strategy="moving-window",
    headers_enabled=True,
)


@app.route("/")
@limiter.limit("3 per minute; 10 per hour")
def index():
    return "hello\n"


@app.route("/health")
@limiter.exempt
def health():
    return "ok\n"


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    from werkzeug.serving import run_simple

    run_simple("127.0.0.1", port, app, threaded=True)
