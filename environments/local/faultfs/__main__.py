"""``python -m environments.local.faultfs --source DIR --mount DIR --control-port N``."""

from __future__ import annotations

import argparse
import sys

from environments.local.faultfs.errors import FaultFsError, FuseUnavailable
from environments.local.faultfs.mount import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m environments.local.faultfs",
        description="Mount a fault-injecting passthrough of --source on --mount.")
    parser.add_argument("--source", required=True, help="backing directory (the real data)")
    parser.add_argument("--mount", required=True, help="empty directory to mount on")
    parser.add_argument("--control-port", type=int, required=True,
                        help="control API port on 127.0.0.1 (0: any free port, printed)")
    parser.add_argument("--max-unsynced-mib", type=int, default=1024,
                        help="unsynced data held in memory above which a file is written back "
                             "(not fsynced), as the kernel would under memory pressure")
    parser.add_argument("--page-cache", action="store_true",
                        help="let the kernel cache file pages (needed for shared mmap; reads "
                             "served from the cache bypass the read faults)")
    args = parser.parse_args(argv)
    try:
        serve(args.source, args.mount, args.control_port, args.max_unsynced_mib << 20,
              page_cache=args.page_cache, announce=lambda line: print(line, flush=True))
    except FuseUnavailable as exc:
        print(f"faultfs: FUSE unavailable: {exc}", file=sys.stderr, flush=True)
        return 3
    except (FaultFsError, OSError) as exc:
        print(f"faultfs: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
