"""A separate client process: submits N operations from T threads, retrying each submission
with the same Idempotency-Key until acknowledged, and appends every acknowledgement to a ledger
(one JSON line, flushed) the moment it arrives. Usage: burst_client.py URL TOKEN N T LEDGER"""

import json
import sys
import threading
import time
import uuid

import httpx

url, token, n, threads, ledger_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lock = threading.Lock()
ledger = open(ledger_path, "a", buffering=1)
counter = iter(range(n))


def worker() -> None:
    client = httpx.Client(timeout=5.0, headers={"Authorization": f"Bearer {token}"})
    while True:
        with lock:
            i = next(counter, None)
        if i is None:
            return
        key = f"burst-{i}-{uuid.uuid4()}"
        body = {"name": f"burst-{i}", "workload": {"image": "127.0.0.1:5000/ml/trainer:1.0"}}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                r = client.post(f"{url}/v1/operations", json=body,
                                headers={"Idempotency-Key": key})
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if r.status_code in (200, 201):
                with lock:
                    ledger.write(json.dumps({"key": key, "id": r.json()["id"],
                                             "status": r.status_code}) + "\n")
                break
            time.sleep(0.05)


ts = [threading.Thread(target=worker) for _ in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
