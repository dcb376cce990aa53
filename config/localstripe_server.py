"""Start localstripe bound to 127.0.0.1 with its on-disk persistence turned off.

localstripe itself listens on every interface and pickles its store to
/tmp/localstripe.pickle on each write (then reloads it at start). Both are wrong for a
sandbox shared by tests: this launcher binds loopback only and keeps the store in memory.
Usage: python -m config.localstripe_server [--port 8420] [--webhook-url U --webhook-secret S]
       [--delivery-log FILE]
`--delivery-log` keeps localstripe's own account of each webhook delivery (one line each,
"successfully delivered" or "failed with response code N"): `make run` writes it under
var/ and the newcomer smoke test asserts every delivery was a 2xx.
"""
import argparse
import logging
import socket

from aiohttp import web
from localstripe import resources, server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8420)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--webhook-url", default="")
    parser.add_argument("--webhook-secret", default="")
    parser.add_argument("--delivery-log", default="")
    args = parser.parse_args()

    resources.Store.dump_to_disk = lambda self: None  # in-memory only
    resources.store.clear()

    if args.webhook_url and args.webhook_secret:
        # localstripe forgets its webhook config on restart: register it at every start.
        from localstripe.webhooks import register_webhook

        register_webhook("verity", args.webhook_url, args.webhook_secret, None)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    logging.basicConfig(level=logging.WARNING)
    if args.delivery_log:
        # localstripe reports deliveries at INFO on this logger (localstripe/webhooks.py).
        handler = logging.FileHandler(args.delivery_log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        deliveries = logging.getLogger("aiohttp.access")
        deliveries.setLevel(logging.INFO)
        deliveries.propagate = False
        deliveries.addHandler(handler)
    web.run_app(server.app, sock=sock, access_log=None, print=None)


if __name__ == "__main__":
    main()
