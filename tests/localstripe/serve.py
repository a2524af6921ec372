"""Runs localstripe on 127.0.0.1 and the given port, keeping nothing on disk.

localstripe's own command listens on every interface and writes its whole store to
/tmp/localstripe.pickle after every write, which concurrent test runs would share. This serves the
same application on loopback only, from an empty store that lives in memory.

Usage: python serve.py PORT
"""

import logging
import sys

from aiohttp import web
from localstripe import resources, server


def main():
    port = int(sys.argv[1])
    # localstripe keeps a copy of its store on disk so that its own command can pick up where it
    # left off. A test run starts empty and must not write over another run's copy.
    type(resources.store).dump_to_disk = lambda self: None
    logger = logging.getLogger("aiohttp.access")
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler())
    web.run_app(server.app, host="127.0.0.1", port=port, access_log=logger)


if __name__ == "__main__":
    main()
