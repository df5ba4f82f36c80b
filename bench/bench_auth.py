"""The run's token check (issue 57): a request's latency with it and without.

    .venv/bin/python bench/bench_auth.py [--requests 400] [--rounds 4]

The same HTTP stack a vLLM server runs (FastAPI under uvicorn, on loopback), one small JSON
route, served twice: bare, and behind server_auth.TokenMiddleware (as vLLM's --middleware puts
it). A keep-alive requests.Session sends `--requests` GETs a round, the two servers in ABBA
order `--rounds` times; the figure is the median per-request latency of each, their ratio and
difference. The check itself (two SHA-256 digests and a constant-time compare) does not depend
on the route, so the difference is what every vLLM request pays on top of its own time (a
smoke-size completion takes about 0.12 s on CPU: docs/performance.md).
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

from benchlib import Measurement, bench_parser, figure, print_figures

from maxent_grpo.server_auth import TokenMiddleware, auth_headers, new_token


def serve(middleware: bool, token: str):
    """(uvicorn server, base URL) of the route, started in a thread."""
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": "tiny"}]}

    if middleware:
        app.add_middleware(TokenMiddleware, token=token)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def round_latency(http, url: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        response = http.get(f"{url}/v1/models", timeout=10)
        times.append(time.perf_counter() - start)
        assert response.status_code == 200, response.status_code
    return times


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--requests", type=int, default=400, help="requests a round")
    parser.add_argument("--rounds", type=int, default=4, help="ABBA pairs of rounds")
    args = parser.parse_args()
    import requests

    measurement = Measurement("auth", args.output)
    token = new_token()
    (bare, bare_url), (checked, checked_url) = serve(False, token), serve(True, token)
    http = requests.Session()
    http.headers.update(auth_headers({"MAXENT_GRPO_SERVER_TOKEN": token}))
    assert requests.get(f"{checked_url}/v1/models", timeout=10).status_code == 401
    round_latency(http, bare_url, 50)  # warm both
    round_latency(http, checked_url, 50)
    times: dict[str, list[float]] = {"bare": [], "checked": []}
    for index in range(args.rounds * 2):
        order = ("bare", "checked") if index % 2 == 0 else ("checked", "bare")
        for name in order:
            url = bare_url if name == "bare" else checked_url
            times[name] += round_latency(http, url, args.requests)
    bare.should_exit = checked.should_exit = True
    without, with_check = (statistics.median(times[k]) for k in ("bare", "checked"))
    figures = [
        figure("request latency without the token check (median)", without * 1e3, "ms"),
        figure("request latency with the token check (median)", with_check * 1e3, "ms"),
        figure("with / without", with_check / without, "x", is_ratio=True),
        figure("added per request", (with_check - without) * 1e6, "us"),
    ]
    print_figures(figures)
    settings = {"requests": args.requests, "rounds": args.rounds}
    measurement.finish(figures, settings)


if __name__ == "__main__":
    main()
