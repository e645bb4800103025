"""A real `reach serve` process for the service's tests (`test_service`, `test_service_page`), and the small dataset
it serves."""
import subprocess, time
from contextlib import contextmanager

import httpx, pytest

from reach_nb.risk.data import build_dataset

from browser import free_port
from reach_cli import REACH, clean_env


@pytest.fixture(scope='module')
def small_db(tmp_path_factory):
    return build_dataset(tmp_path_factory.mktemp('data')/'risk.duckdb', rows=100_000)


@contextmanager
def service(tmp, db, *opts, env=None):
    "`reach serve OPTS` in its own process, on a free port, its traces and sessions under `tmp`; yields (url, process)."
    for attempt in range(3):  # a port found free can be taken by another process before the service binds it
        port = free_port()
        proc = subprocess.Popen([REACH, 'serve', '--port', str(port), *opts], cwd=tmp, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True,
                                env=clean_env(REACH_DATA_DB=str(db), REACH_TRACE_DIR=str(tmp/'traces'), **(env or {})))
        base = f'http://127.0.0.1:{port}'
        deadline, said = time.monotonic() + 60, ''
        while True:
            try:
                if httpx.get(f'{base}/openapi.json', timeout=1).status_code == 200: break
            except httpx.HTTPError: time.sleep(0.1)
            if proc.poll() is not None or time.monotonic() > deadline:
                said = proc.stderr.read()[-2000:] if proc.poll() is not None else ''
                if 'Address already in use' in said and attempt < 2: break
                if proc.poll() is None: proc.terminate(); proc.wait(15)
                pytest.fail(f'reach serve did not start: {proc.poll()} {said}')
        if 'Address already in use' not in said: break
    try:
        yield base, proc
    finally:
        if proc.poll() is None: proc.terminate(); proc.wait(15)
