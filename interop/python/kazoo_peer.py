"""kazoo's Semaphore and Lock as peers of zklock's lock engine, for tests/kazoo_interop.rs.

    kazoo_peer.py try CONNECT PATH MAX_LEASES TIMEOUT
        one acquire: prints "acquired", "timed out" or "refused: <error>", then releases.
    kazoo_peer.py hold CONNECT PATH MAX_LEASES TIMEOUT
        acquires, prints "acquired <lease node>", holds until a line arrives on stdin, releases,
        prints "released".
    kazoo_peer.py lock-try CONNECT PATH PATTERN TIMEOUT
    kazoo_peer.py lock-hold CONNECT PATH PATTERN TIMEOUT
        the same with kazoo's Lock, given PATTERN as its extra_lock_patterns ("" for none).
"""

import sys

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout


def main():
    verb, connect, path, max_leases, timeout = sys.argv[1:6]
    client = KazooClient(hosts=connect, timeout=10)
    client.start(timeout=10)
    try:
        if verb.startswith("lock-"):
            verb = verb[len("lock-"):]
            patterns = [max_leases] if max_leases else []
            semaphore = client.Lock(path, identifier="kazoo-peer", extra_lock_patterns=patterns)
        else:
            semaphore = client.Semaphore(path, identifier="kazoo-peer", max_leases=int(max_leases))
        try:
            acquired = semaphore.acquire(timeout=float(timeout))
        except ValueError as e:
            print(f"refused: {e}", flush=True)
            return
        except LockTimeout:
            acquired = False
        if not acquired:
            print("timed out", flush=True)
            return
        if verb == "try":
            print("acquired", flush=True)
        else:
            print(f"acquired {getattr(semaphore, 'node', None) or semaphore.create_path}", flush=True)
            sys.stdin.readline()
        semaphore.release()
        if verb == "hold":
            print("released", flush=True)
    finally:
        client.stop()
        client.close()


if __name__ == "__main__":
    main()
